"""Device-neutral data loading: a tuned ``torch.utils.data.DataLoader`` and image-folder datasets.

Device plugins that have a faster loader (DALI, HabanaDataLoader) fall back to
:func:`torch_dataloader` when theirs does not apply.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, IterableDataset

from devplug.core.errors import DataError
from devplug.core.records import ImageFolderSource, LoaderChoice, LoaderOptions

log = logging.getLogger(__name__)

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".ppm", ".pgm")


def list_images(root: str | os.PathLike[str]) -> list[tuple[Path, int]]:
    """Image files under ``root`` with class indices, sorted.

    A torchvision ImageFolder layout (``root/<class>/<image>``) gives one class per sub-folder; a flat
    folder of images gives class 0 for all. Raises :class:`DataError` when the folder is missing or
    holds no image.
    """
    path = Path(root)
    if not path.exists():
        raise DataError(f"data folder {str(path)!r} does not exist; pass a folder of images")
    if not path.is_dir():
        raise DataError(f"data path {str(path)!r} is not a folder; pass a folder of images")
    try:
        classes = sorted(p.name for p in path.iterdir() if p.is_dir() and not p.name.startswith("."))
    except OSError as exc:
        raise DataError(f"cannot read data folder {str(path)!r}: {exc}") from exc
    items: list[tuple[Path, int]] = []
    flat = sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS)
    items += [(p, 0) for p in flat]
    offset = 1 if flat else 0
    for index, cls in enumerate(classes):
        for dirpath, _dirs, files in sorted(os.walk(path / cls)):
            for name in sorted(files):
                if name.lower().endswith(IMAGE_EXTENSIONS):
                    items.append((Path(dirpath) / name, index + offset))
    if not items:
        raise DataError(
            f"data folder {str(path)!r} holds no images (looked for {', '.join(IMAGE_EXTENSIONS)}); "
            "put images in it, flat or one sub-folder per class"
        )
    return items


def image_transform(source: ImageFolderSource) -> Any:
    """The torchvision transform an ImageFolderSource describes: resize (short side), center-crop, normalize."""
    from torchvision import transforms  # lazy: torchvision only when images are loaded

    return transforms.Compose(
        [
            transforms.Resize(source.image_size),
            transforms.CenterCrop(source.image_size),
            transforms.ToTensor(),
            transforms.Normalize(source.mean, source.std),
        ]
    )


class ImageFolderDataset(Dataset):
    """Images from a folder, resized, center-cropped and normalized as an ImageFolderSource says.

    An image that cannot be decoded (truncated, not an image, unreadable) is replaced by the next
    readable one when ``source.skip_unreadable`` is set; each such file is logged once per process
    and listed in :attr:`unreadable`. When no image can be read, or skipping is off, a
    :class:`DataError` names the file.
    """

    def __init__(self, source: ImageFolderSource) -> None:
        self.source = source
        self.items = list_images(source.root)
        self.unreadable: dict[str, str] = {}
        self.transform = image_transform(source)

    def __len__(self) -> int:
        return len(self.items)

    def _load(self, index: int) -> tuple[torch.Tensor, int]:
        from PIL import Image

        path, label = self.items[index]
        with Image.open(path) as image:
            return self.transform(image.convert("RGB")), label

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        for offset in range(len(self.items)):
            candidate = (index + offset) % len(self.items)
            path = str(self.items[candidate][0])
            if offset and path in self.unreadable:
                continue
            try:
                return self._load(candidate)
            except (OSError, ValueError, SyntaxError) as exc:  # PIL raises all three for broken files
                if not self.source.skip_unreadable:
                    raise DataError(
                        f"cannot decode image {path!r}: {exc}; remove or replace the file, or set "
                        "ImageFolderSource(skip_unreadable=True) to skip such files"
                    ) from exc
                if path not in self.unreadable:
                    self.unreadable[path] = f"{type(exc).__name__}: {exc}"
                    log.warning("skipping unreadable image %s (%s); using the next readable one", path, exc)
        first_error = next(iter(self.unreadable.values()))  # every candidate failed, so there is one
        raise DataError(f"none of the {len(self.items)} images in {self.source.root!r} can be decoded; "
                        f"check the files (first error: {first_error})")


def as_dataset(source: Any) -> Dataset:
    """A torch Dataset for ``source`` (an ImageFolderSource becomes an :class:`ImageFolderDataset`)."""
    if isinstance(source, ImageFolderSource):
        return ImageFolderDataset(source)
    if isinstance(source, (str, os.PathLike)):
        raise DataError(
            f"got a path ({source!s}) as a data source; wrap it as devplug.ImageFolderSource(root, image_size)"
        )
    return source


def make_sampler(dataset: Dataset, options: LoaderOptions) -> Any:
    """The author's sampler, else a ``DistributedSampler`` over this rank's shard (one shard in one process).

    The sampler is a DistributedSampler even in a single process, so the order of samples is the same
    permutation (seeded with ``seed + epoch``) whatever the world size: rank ``r`` of ``W`` reads every
    ``W``-th sample of it, and a job that consumed ``k`` batches of ``B`` on ``W`` ranks has read the
    first ``k·B·W`` samples, which lets a checkpoint resume at the same place on another world size.
    An ``IterableDataset`` has no sampler.
    """
    if options.sampler is not None or isinstance(dataset, IterableDataset):
        return options.sampler
    return DistributedSampler(
        dataset,
        num_replicas=options.world_size,
        rank=options.rank,
        shuffle=options.shuffle,
        seed=options.seed,
        drop_last=options.drop_last and options.world_size > 1,
    )


def torch_dataloader(source: Any, options: LoaderOptions, *, reason: str = "") -> LoaderChoice:
    """A ``torch.utils.data.DataLoader`` tuned from ``options`` (workers, pinning, prefetch, sharding)."""
    dataset = as_dataset(source)
    try:
        size = len(dataset)  # type: ignore[arg-type]
    except TypeError:
        size = None
    if size == 0:
        raise DataError("the dataset is empty; give the loader at least one sample")
    sampler = make_sampler(dataset, options)
    workers = options.num_workers
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
    implementation = f"torch DataLoader(workers={workers}, pin_memory={bool(options.pin_memory)})"
    return LoaderChoice(loader=loader, implementation=implementation, sampler=sampler, reason=reason)
