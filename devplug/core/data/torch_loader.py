"""Device-neutral data loading: a tuned ``torch.utils.data.DataLoader`` and image-folder datasets.

Device plugins that have a faster loader (DALI, HabanaDataLoader) fall back to
`torch_dataloader` when theirs does not apply.
"""

from __future__ import annotations

import itertools
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, IterableDataset

from devplug.core.contract.records import ImageFolderSource, LoaderChoice, LoaderOptions
from devplug.core.data.evaluation import EvaluationSampler
from devplug.core.data.images import display_path, load_rgb, printable
from devplug.core.data.tuning import tune_loader
from devplug.core.errors import ConfigError, DataError

log = logging.getLogger(__name__)

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".ppm", ".pgm")
"""The file name endings an `ImageFolderSource` reads as images (compared lower-cased)."""


def list_images(root: str | os.PathLike[str]) -> list[tuple[Path, int]]:
    """Image files under ``root`` with class indices, sorted.

    A torchvision ImageFolder layout (``root/<class>/<image>``) gives one class per sub-folder; a flat
    folder of images gives class 0 for all. Symbolic links are followed, but every directory is read once:
    a link back to the root, a loop, or two links to one folder add no image twice. File names need not be
    valid UTF-8. Raises `DataError` when the path is empty, missing, not a folder, or holds no image.
    """
    if not os.fspath(root):
        raise DataError("the data folder path is empty (''); pass a folder of images, e.g. --data ./images")
    path = Path(root)
    shown = display_path(path)
    if not path.exists():
        raise DataError(f"data folder {shown!r} does not exist; pass a folder of images")
    if not path.is_dir():
        raise DataError(f"data path {shown!r} is not a folder; pass a folder of images")
    try:
        entries = sorted(os.scandir(path), key=lambda entry: entry.name)
        seen = {_directory_id(path)}
    except OSError as exc:
        raise DataError(f"cannot read data folder {shown!r}: {printable(str(exc))}") from exc
    flat = [Path(e.path) for e in entries if _is_image(e.name) and _is_file(e)]
    items: list[tuple[Path, int]] = [(p, 0) for p in flat]
    label = 1 if flat else 0
    for entry in entries:
        if entry.name.startswith(".") or not _is_dir(entry):
            continue
        found = _walk(Path(entry.path), seen)
        if found is None:
            continue  # a second way into a directory already listed (a link to the root or to another class)
        items += [(p, label) for p in found]
        label += 1
    if not items:
        raise DataError(
            f"data folder {shown!r} holds no images (looked for {', '.join(IMAGE_EXTENSIONS)}); "
            "put images in it, flat or one sub-folder per class"
        )
    return items


def image_transform(source: ImageFolderSource) -> Any:
    """The torchvision transform an ImageFolderSource describes: resize (short side), center-crop, normalize.

    For loaders that decode through torchvision (a torchvision ``ImageFolder`` for HabanaDataLoader);
    devplug's own `ImageFolderDataset` decodes with `load_rgb`.
    """
    from torchvision import transforms  # lazy: torchvision only when images are loaded

    return transforms.Compose(
        [
            transforms.Resize(source.image_size),
            transforms.CenterCrop(source.image_size),
            transforms.ToTensor(),
            transforms.Normalize(source.mean, source.std),
        ]
    )


def _is_image(name: str) -> bool:
    return name.lower().endswith(IMAGE_EXTENSIONS)


def _is_file(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_file()
    except OSError:
        return False


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir()
    except OSError:
        return False


def _directory_id(path: str | os.PathLike[str]) -> tuple[int, int]:
    stat = os.stat(path)
    return stat.st_dev, stat.st_ino


def _walk(top: Path, seen: set[tuple[int, int]]) -> list[Path] | None:
    """Image files under ``top`` (links followed, each directory once), ordered as ``sorted(os.walk(top))``.

    ``None`` when ``top`` itself was already seen. Directories that cannot be read are left out, as
    ``os.walk`` does.
    """
    try:
        ident = _directory_id(top)
    except OSError:
        return None
    if ident in seen:
        log.warning("skipping %s: the same directory as one already listed (a symbolic link)", display_path(top))
        return None
    seen.add(ident)
    folders: list[tuple[str, list[str]]] = []
    pending = [top]
    while pending:
        folder = pending.pop()
        try:
            entries = sorted(os.scandir(folder), key=lambda entry: entry.name)
        except OSError:
            continue
        folders.append((os.fspath(folder), [e.name for e in entries if _is_image(e.name) and _is_file(e)]))
        for entry in reversed(entries):  # depth first, in name order: the first path to a directory keeps it
            if not _is_dir(entry):
                continue
            try:
                ident = _directory_id(entry.path)
            except OSError:
                continue
            if ident in seen:
                log.warning("skipping %s: the same directory as one already listed (a symbolic link)",
                            display_path(entry.path))
                continue
            seen.add(ident)
            pending.append(Path(entry.path))
    return [Path(folder) / name for folder, names in sorted(folders) for name in names]


class ImageFolderDataset(Dataset):
    """Images from a folder, resized, center-cropped and normalized as an ImageFolderSource says.

    Decoding is `devplug.toolkit.load_rgb`: any pixel format (16-bit, palette, grayscale, CMYK,
    alpha) becomes 8-bit RGB, EXIF orientation is applied, and large JPEGs are decoded at reduced scale.
    An image that cannot be decoded (truncated, not an image, over Pillow's decompression-bomb limit) is
    replaced by the next readable one when ``source.skip_unreadable`` is set; each such file is logged once
    per process and listed in `unreadable`. When no image can be read, or skipping is off, a
    `DataError` names the file.
    """

    def __init__(self, source: ImageFolderSource) -> None:
        self.source = source
        self.items = list_images(source.root)
        self.unreadable: dict[str, str] = {}
        self.mean = torch.tensor(source.mean, dtype=torch.float32).view(3, 1, 1)
        self.std = torch.tensor(source.std, dtype=torch.float32).view(3, 1, 1)

    def __len__(self) -> int:
        return len(self.items)

    def _load(self, index: int) -> tuple[torch.Tensor, int]:
        path, label = self.items[index]
        pixels = torch.from_numpy(load_rgb(path, self.source.image_size)).permute(2, 0, 1)
        return pixels.float().div_(255.0).sub_(self.mean).div_(self.std), label

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        for offset in range(len(self.items)):
            candidate = (index + offset) % len(self.items)
            path = display_path(self.items[candidate][0])
            if offset and path in self.unreadable:
                continue
            try:
                return self._load(candidate)
            except FileNotFoundError as exc:  # not a broken file: the data went away under the run
                raise DataError(f"image {path!r} is gone ({printable(exc.strerror or str(exc))}): the data folder "
                                "changed while the run was reading it; restore it, or start again on what is left"
                                ) from exc
            except Exception as exc:  # (Pillow's decoders raise many kinds for broken files)
                reason = printable(f"{type(exc).__name__}: {exc}")
                if not self.source.skip_unreadable:
                    raise DataError(
                        f"cannot decode image {path!r}: {printable(str(exc))}; remove or replace the file, or set "
                        "ImageFolderSource(skip_unreadable=True) to skip such files"
                    ) from exc
                if path not in self.unreadable:
                    self.unreadable[path] = reason
                    log.warning("skipping unreadable image %s (%s); using the next readable one", path, reason)
        first_error = next(iter(self.unreadable.values()))  # every candidate failed, so there is one
        raise DataError(f"none of the {len(self.items)} images in {display_path(self.source.root)!r} can be "
                        f"decoded; check the files (first error: {first_error})")


def as_dataset(source: Any) -> Dataset:
    """A torch Dataset for ``source`` (an ImageFolderSource becomes an `ImageFolderDataset`)."""
    if isinstance(source, ImageFolderSource):
        return ImageFolderDataset(source)
    if isinstance(source, (str, os.PathLike)):
        raise DataError(
            f"got a path ({source!s}) as a data source; wrap it as devplug.ImageFolderSource(root, image_size)"
        )
    return source


class ShardSampler(DistributedSampler):
    """devplug's ``DistributedSampler``: its next pass may start some way in (the rest of a resumed epoch).

    ``start_next_at(n)`` makes the next ``iter()`` skip this rank's first ``n`` indices without reading
    their samples; later passes start at the beginning again.
    """

    _start = 0

    def start_next_at(self, index: int) -> None:
        """Start the next pass at this rank's ``index``-th sample of the epoch's order."""
        self._start = index

    def __iter__(self) -> Iterator[Any]:
        start, self._start = self._start, 0
        indices = super().__iter__()
        return itertools.islice(indices, start, None) if start else indices


def make_sampler(dataset: Dataset, options: LoaderOptions) -> Any:
    """The author's sampler, else a ``DistributedSampler`` over this rank's shard (one shard in one process).

    The sampler is a DistributedSampler even in a single process, so the order of samples is the same
    permutation (seeded with ``seed + epoch``) whatever the world size: rank ``r`` of ``W`` reads every
    ``W``-th sample of it, and a job that consumed ``k`` batches of ``B`` on ``W`` ranks has read the
    first ``k·B·W`` samples, which lets a checkpoint resume at the same place on another world size.
    An evaluation loader (``options.evaluation``) gets an `EvaluationSampler` instead: this rank's
    contiguous block of the dataset, every sample on exactly one rank, nothing padded. An
    ``IterableDataset`` has no sampler: each rank reads what it yields (`torch_dataloader` warns under several
    ranks). A training loader's sampler is a `ShardSampler`, so a resumed
    epoch can start at its first unread sample.
    """
    if options.sampler is not None or isinstance(dataset, IterableDataset):
        return options.sampler
    if options.evaluation:
        return EvaluationSampler(len(dataset), rank=options.rank, world_size=options.world_size,  # type: ignore[arg-type]
                                 shuffle=options.shuffle, seed=options.seed)
    return ShardSampler(
        dataset,
        num_replicas=options.world_size,
        rank=options.rank,
        shuffle=options.shuffle,
        seed=options.seed,
        drop_last=options.drop_last and options.world_size > 1,
    )


def _batches(loader: DataLoader) -> int | None:
    """Batches per epoch of ``loader``, ``None`` where it does not say (an IterableDataset, an unsized sampler)."""
    if isinstance(loader.dataset, IterableDataset):
        return None
    try:
        return len(loader)
    except TypeError:
        return None


def torch_dataloader(source: Any, options: LoaderOptions, *, reason: str = "",
                     compute_competes: bool | None = None, pin_only_with_workers: bool = False) -> LoaderChoice:
    """A ``torch.utils.data.DataLoader`` built from ``options`` (workers, pinning, prefetch, sharding).

    With ``compute_competes`` given (contract 1.3), the options the author left automatic are tuned
    first by measuring the source (`devplug.toolkit.tune_loader`; ``True`` where the
    training step runs on the host's cores, as on a CPU device), and what was decided is added to
    ``reason``. Left ``None``, the options are used as they are. ``pin_only_with_workers``: the plugin chose
    ``pin_memory=True`` itself (the author did not ask) and wants it only where the loader has worker
    processes: torch's DataLoader then pins on a thread of its own, while without workers it pins every batch
    in the main process, a host copy that costs more than the copy to the device it speeds up.
    """
    dataset = as_dataset(source)
    try:
        size = len(dataset)  # type: ignore[arg-type]  # TypeError without one
    except TypeError:
        size = None
    if size == 0:
        raise DataError("the dataset is empty; give the loader at least one sample")
    if isinstance(dataset, IterableDataset) and (options.shuffle or options.sampler is not None):
        given = "shuffle=True" if options.shuffle else "a sampler"
        raise ConfigError(f"the IterableDataset {type(dataset).__name__} yields its samples in its own order, so "
                          f"{given} cannot apply to it; leave it out (shuffle inside the data set), or give a "
                          "Dataset indexed by position")
    if compute_competes is not None:
        options, tuned = tune_loader(dataset, options, compute_competes=compute_competes)
        reason = "; ".join(part for part in (reason, tuned) if part)
    sampler = make_sampler(dataset, options)
    if isinstance(dataset, IterableDataset) and options.world_size > 1:
        log.warning("each of the %d ranks reads all that the IterableDataset %s yields (devplug shards only what it "
                    "samples by index): split it by rank yourself (trainer.rank, trainer.world_size), or every rank "
                    "reads the same samples", options.world_size, type(dataset).__name__)
    workers = options.num_workers
    if pin_only_with_workers and options.pin_memory and workers == 0:
        options = attrs.evolve(options, pin_memory=False)
        reason = "; ".join(part for part in (reason, "auto: not pinned, no worker processes (torch's DataLoader "
                                             "would pin each batch in the main process)") if part)
    kwargs: dict[str, Any] = {}
    if workers > 0:
        kwargs["persistent_workers"] = options.persistent_workers
        if options.prefetch_factor is not None:
            kwargs["prefetch_factor"] = options.prefetch_factor
    generator = torch.Generator()
    generator.manual_seed(options.seed)
    loader = DataLoader(
        dataset,
        batch_size=options.batch_size,
        shuffle=options.shuffle if sampler is None else False,
        sampler=sampler,
        num_workers=workers,
        pin_memory=bool(options.pin_memory),
        drop_last=options.drop_last,
        collate_fn=options.collate_fn,
        generator=generator,
        **kwargs,
    )
    if not options.evaluation and _batches(loader) == 0:  # an epoch would train nothing, without a word
        shard = len(sampler) if sampler is not None else size  # sized: the loader is
        where = f"{shard} samples" + (f" on each of {options.world_size} ranks" if options.world_size > 1 else "")
        if not options.drop_last:
            raise DataError(f"the training loader has no batch: its sampler gives {where}; check the sampler")
        raise DataError(f"the training loader has no batch: {where}, fewer than batch_size={options.batch_size} with "
                        "drop_last=True; lower batch_size or set drop_last=False")
    implementation = f"torch DataLoader(workers={workers}, pin_memory={bool(options.pin_memory)})"
    return LoaderChoice(loader=loader, implementation=implementation, sampler=sampler, reason=reason)
