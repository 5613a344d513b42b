"""What the run trains on: the embedded shapes, random images, or a folder (through the image cache or not)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs

import devplug
from devplug.toolkit import display_path, list_images

from . import cli
from .cache import CachedImages, CacheReport, prepare_cache
from .cache.prepare import build_workers
from .embedded_data import FakeImages, ShapesDataset


@attrs.frozen
class TrainingData:
    """The source for ``trainer.dataloader``, a description for the console, its image count, the cache report."""

    source: Any  # a Dataset, or a devplug.ImageFolderSource for --no-cache
    description: str
    images: int
    cache: CacheReport | None = None  # folders read through the cache only

    def close(self) -> None:
        """Release the cache version, so that a later rebuild may remove it."""
        if isinstance(self.source, CachedImages):
            self.source.close()


def load_training_data(settings: cli.Settings, trainer: devplug.Trainer | None) -> TrainingData:
    """The data ``settings`` name; for a folder, its cache is reused or built first (``--no-cache``: not).

    Under ``torchrun`` the main process builds a missing cache while the others wait, then all map it; a
    process that cannot (the main one's build failed, or the cache is not in a folder every machine sees)
    stops every process with one error line.
    ``trainer=None`` (``--cache-only``) builds the cache in this process.
    """
    size = settings.spec.image_size
    if settings.data == cli.EMBEDDED:
        dataset = ShapesDataset(size)
        return TrainingData(dataset, f"embedded shapes ({len(dataset)} generated {size}x{size} images)", len(dataset))
    if settings.data == cli.FAKE:
        dataset = FakeImages(size, seed=settings.args.seed)
        return TrainingData(dataset, f"fake (random {size}x{size} images, compute only)", len(dataset))
    root = Path(settings.data).expanduser()
    if settings.args.no_cache:
        count = len(list_images(root))  # clear errors for a missing or empty folder
        source = devplug.ImageFolderSource(str(root), image_size=size)
        return TrainingData(source, f"{display_path(root)} ({count} images, decoded every epoch)", count)
    return _cached_folder(settings, root, trainer)


def _cached_folder(settings: cli.Settings, root: Path, trainer: devplug.Trainer | None) -> TrainingData:
    size = settings.spec.image_size
    main = trainer is None or trainer.is_main_process
    # Under torchrun the main process builds while the others wait for its word (its error ends them too);
    # then every process says whether it could open the cache, so no rank trains on while another stopped.
    ranks = trainer if trainer is not None and trainer.world_size > 1 else None
    if ranks is not None and not main:
        failure = ranks.broadcast(None)
        if failure is not None:
            raise devplug.DataError(f"the main process could not prepare the image cache: {failure}")
    bar: Any = None

    def progress(done: int, total: int) -> None:
        nonlocal bar
        if bar is None:
            from tqdm.auto import tqdm

            bar = tqdm(total=total, unit="image", desc="decoding into the cache", mininterval=2.0)
        bar.update(done - bar.n)

    show = main and not settings.args.no_progress
    try:
        # The build decodes on every core (--workers, when given, caps it); the cache is then reused.
        workers = None if settings.args.workers is None else min(settings.args.workers, build_workers())
        dataset, report = prepare_cache(root, size, settings.cache_dir, workers=workers, build=main,
                                        progress=progress if show else None, on_wait=_waiting)
    except Exception as exc:
        if ranks is not None and main:
            ranks.broadcast(" ".join(str(exc).split()) or type(exc).__name__)
        elif ranks is not None:
            ranks.all_reduce(1, op="max")
        raise
    finally:
        if bar is not None:
            bar.close()
    if ranks is not None and main:
        ranks.broadcast(None)
    if ranks is not None and ranks.all_reduce(0, op="max"):
        dataset.close()  # another process could not open the cache this one built or opened
        where = display_path(settings.cache_dir)
        raise devplug.DataError(f"another process could not open the image cache in {where!r} that the main process "
                                "built; on several machines, pass a --cache-dir that all of them share (or --no-cache)")
    description = f"{display_path(root)} ({report.images} images, cached at {size}x{size})"
    return TrainingData(dataset, description, report.images, report)


def _waiting(path: Path) -> None:
    print(f"image cache: another process is building {display_path(path)}; waiting for it", flush=True)
