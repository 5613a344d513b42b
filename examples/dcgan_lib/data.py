"""An image folder decoded once into a uint8 memory-mapped cache, so training opens no image file.

Seed 000's bottleneck was the data loader: every batch did thousands of ``PIL.open()`` calls on
360×480 images only to shrink them to 64×64 for the GPU. Here the folder is decoded, resized
(short side) and center-cropped once, out of band, into ``<cache-dir>/<name>.npy`` (N×3×S×S uint8,
memory-mapped); training then reads slices of that file. A JSON file beside it records what it was
built from. The cache is keyed on the image size and on every file's path, size and modification
time, so it is reused while the folder is unchanged and rebuilt when a file is added, removed or
touched. Unreadable images are skipped and counted; a folder with no readable image is an error.

Batches stay uint8 until they reach the device (4× less to copy than float32); the training loop
scales them to [-1, 1] there.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from devplug import DataError
from devplug.toolkit import list_images

CACHE_FORMAT = 1


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/devplug/dcgan`` (``~/.cache/devplug/dcgan`` when unset)."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "devplug" / "dcgan"


def decode_image(path: str | os.PathLike[str], image_size: int) -> np.ndarray:
    """One image as ``(3, S, S)`` uint8: short side resized to ``image_size``, center-cropped.

    JPEGs are decoded at reduced scale where possible (``Image.draft``), which is most of the
    speed-up for large photos.
    """
    from PIL import Image

    with Image.open(path) as image:
        image.draft("RGB", (image_size, image_size))
        rgb = image.convert("RGB")
    width, height = rgb.size
    scale = image_size / min(width, height)
    size = (max(image_size, round(width * scale)), max(image_size, round(height * scale)))
    rgb = rgb.resize(size, Image.Resampling.BILINEAR)
    left, top = (size[0] - image_size) // 2, (size[1] - image_size) // 2
    rgb = rgb.crop((left, top, left + image_size, top + image_size))
    return np.asarray(rgb, dtype=np.uint8).transpose(2, 0, 1).copy()


class _Decode(Dataset):
    """Decodes files for the cache build (run through a DataLoader so workers decode in parallel)."""

    def __init__(self, paths: list[str], image_size: int) -> None:
        self.paths = paths
        self.image_size = image_size

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> tuple[int, np.ndarray | None, str]:
        try:
            return index, decode_image(self.paths[index], self.image_size), ""
        except Exception as exc:  # any failure to decode one file: skip it and say why
            return index, None, f"{type(exc).__name__}: {exc}".strip()


def _collate_list(items: list[Any]) -> list[Any]:
    return items


@attrs.define
class CacheReport:
    """What :func:`prepare_cache` did: the files, whether it built, and how many images it opened."""

    path: Path
    images: int
    built: bool
    opened: int = 0
    skipped: list[tuple[str, str]] = attrs.field(factory=list)
    seconds: float = 0.0

    def describe(self) -> str:
        """One line for the console."""
        if not self.built:
            return f"image cache: reusing {self.path} ({self.images} images; no image file opened)"
        text = (f"image cache: decoded {self.opened} image files into {self.path} "
                f"({self.images} images, {self.seconds:.1f} s)")
        if self.skipped:
            path, reason = self.skipped[0]
            text += f"; skipped {len(self.skipped)} unreadable (first: {path}: {reason})"
        return text


class CachedImages(Dataset):
    """The cached images as ``(uint8 tensor (3, S, S), label)``; the memory map is opened per process."""

    def __init__(self, path: str | os.PathLike[str], labels: list[int]) -> None:
        self.path = str(path)
        self.labels = labels
        self._array: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.labels)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_array": None}  # workers map the file themselves

    @property
    def array(self) -> np.ndarray:
        """The memory-mapped ``(N, 3, S, S)`` uint8 array."""
        if self._array is None:
            self._array = np.load(self.path, mmap_mode="r")
        return self._array

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return torch.from_numpy(np.array(self.array[index])), self.labels[index]


def _cache_key(root: Path, files: list[tuple[Path, int]], image_size: int) -> tuple[str, list[tuple[Path, int]]]:
    """Hash of image size and every file's relative path, label, size and mtime; also the stat-able files."""
    digest = hashlib.sha256(f"dcgan-cache {CACHE_FORMAT} {image_size}\n".encode())
    kept = []
    for path, label in files:
        try:
            stat = path.stat()
        except OSError:
            continue  # vanished or unreadable: not part of the data set
        kept.append((path, label))
        digest.update(f"{path.relative_to(root)}\0{label}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest(), kept


def _cache_stem(root: Path, image_size: int) -> str:
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", root.name) or "data"
    where = hashlib.sha256(str(root).encode()).hexdigest()[:8]
    return f"{name}-{where}-{image_size}px"


def _read_meta(meta_path: Path, key: str, array_path: Path) -> dict[str, Any] | None:
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or meta.get("key") != key or meta.get("format") != CACHE_FORMAT:
        return None
    try:
        array = np.load(array_path, mmap_mode="r")
    except (OSError, ValueError):
        return None
    # Rows of skipped (unreadable) images stay unused at the end of the array.
    if array.shape[0] < len(meta.get("labels", ())) or array.dtype != np.uint8:
        return None
    return meta


def prepare_cache(
    root: str | os.PathLike[str],
    image_size: int,
    cache_dir: str | os.PathLike[str],
    *,
    workers: int = 0,
    build: bool = True,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[CachedImages, CacheReport]:
    """The cached data set for ``root`` at ``image_size``, built if missing or stale.

    ``build=False`` waits for nothing and builds nothing: it only opens a cache another process
    (rank 0) has just built. Raises :class:`devplug.DataError` for a missing or empty folder, a folder
    with no readable image, or a cache directory that cannot be written.
    """
    root_path = Path(root).expanduser().resolve()
    files = list_images(root_path)
    key, files = _cache_key(root_path, files, image_size)
    if not files:
        raise DataError(f"no image in {str(root_path)!r} can be read (all vanished or unreadable)")
    directory = Path(cache_dir).expanduser()
    stem = _cache_stem(root_path, image_size)
    array_path = directory / f"{stem}-{key[:16]}.npy"
    meta_path = array_path.with_suffix(".json")
    meta = _read_meta(meta_path, key, array_path)
    if meta is not None:
        report = CacheReport(array_path, len(meta["labels"]), built=False, skipped=[tuple(s) for s in meta["skipped"]])
        return CachedImages(array_path, list(meta["labels"])), report
    if not build:
        raise DataError(f"image cache {str(array_path)!r} is missing or stale after the main process built it")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DataError(f"cannot create the cache directory {str(directory)!r}: {exc}; pass --cache-dir") from exc
    return _build(root_path, files, image_size, key, array_path, meta_path, stem, workers, progress)


def _build(
    root: Path,
    files: list[tuple[Path, int]],
    image_size: int,
    key: str,
    array_path: Path,
    meta_path: Path,
    stem: str,
    workers: int,
    progress: Callable[[int, int], None] | None,
) -> tuple[CachedImages, CacheReport]:
    start = time.perf_counter()
    tmp_path = array_path.with_name(f".{array_path.stem}.{os.getpid()}.tmp.npy")
    shape = (len(files), 3, image_size, image_size)
    try:
        out = np.lib.format.open_memmap(tmp_path, mode="w+", dtype=np.uint8, shape=shape)
    except OSError as exc:
        raise DataError(f"cannot write the image cache {str(tmp_path)!r}: {exc}; pass --cache-dir") from exc
    labels: list[int] = []
    skipped: list[tuple[str, str]] = []
    opened = 0
    # A private generator: building the cache must not consume the training RNG (a run that builds the
    # cache and one that reuses it then train identically).
    loader = DataLoader(_Decode([str(p) for p, _ in files], image_size), batch_size=64, num_workers=workers,
                        collate_fn=_collate_list, generator=torch.Generator())
    try:
        for chunk in loader:
            for index, pixels, error in chunk:
                opened += 1
                if pixels is None:
                    skipped.append((str(files[index][0].relative_to(root)), error))
                    continue
                out[len(labels)] = pixels
                labels.append(files[index][1])
            if progress is not None:
                progress(opened, len(files))
        out.flush()
        del out
        if not labels:
            first, reason = skipped[0]
            raise DataError(f"none of the {len(files)} images in {str(root)!r} can be read "
                            f"(first: {first}: {reason})")
        os.replace(tmp_path, array_path)
    finally:
        tmp_path.unlink(missing_ok=True)
    meta = {"format": CACHE_FORMAT, "key": key, "root": str(root), "image_size": image_size,
            "labels": labels, "skipped": skipped}
    tmp_meta = meta_path.with_name(f".{meta_path.name}.{os.getpid()}.tmp")
    tmp_meta.write_text(json.dumps(meta))
    os.replace(tmp_meta, meta_path)
    for stale in array_path.parent.glob(f"{stem}-*"):  # earlier caches of this folder at this size
        if stale not in (array_path, meta_path):
            stale.unlink(missing_ok=True)
    report = CacheReport(array_path, len(labels), built=True, opened=opened, skipped=skipped,
                         seconds=time.perf_counter() - start)
    return CachedImages(array_path, labels), report
