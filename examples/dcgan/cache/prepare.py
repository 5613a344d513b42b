"""Build or reuse the cache of one image folder at one image size (`prepare_cache`).

The cache is keyed on the image size, on every file's path, size and modification time, and on what decodes
the images (Pillow's version, devplug's decoding code), so it is reused while the folder and the decoder are
unchanged and rebuilt when a file is added, removed or touched, or the decoder changed. Unreadable
images are skipped and counted; a folder with no readable image is an error. The build decodes on every
core (`.decode_pool`), checks the free space first and writes a fully allocated file
(`.writer`); versions in use are never deleted and two jobs that need the same missing cache build it
once (`.locks`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from devplug import DataError
from devplug.toolkit import available_cpus, display_path, list_images, load_rgb

from .dataset import CachedImages
from .decode_pool import decode_files
from .locks import build_lock, collect_stale, open_locked
from .writer import CacheWriter, check_free_space, npy_header, write_text

CACHE_FORMAT = 2


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/devplug/dcgan`` (``~/.cache/devplug/dcgan`` when unset)."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "devplug" / "dcgan"


def build_workers() -> int:
    """Decode processes for a cache build: every core this process may run on."""
    return available_cpus()


@attrs.define
class CacheReport:
    """What `prepare_cache` did: the files, whether it built, and how many images it opened."""

    path: Path
    images: int
    built: bool
    opened: int = 0
    skipped: list[tuple[str, str]] = attrs.field(factory=list)
    seconds: float = 0.0
    workers: int = 0

    @property
    def rate(self) -> float:
        """Image files decoded per second during the build (0 when nothing was built)."""
        return self.opened / self.seconds if self.built and self.seconds > 0 else 0.0

    def describe(self) -> str:
        """One line for the console."""
        where = display_path(self.path)
        if not self.built:
            return f"image cache: reusing {where} ({self.images} images; no image file opened)"
        processes = f"{self.workers} decode process{'es' if self.workers > 1 else ''}" if self.workers \
            else "in this process"
        text = (f"image cache: decoded {self.opened} image files into {where} "
                f"({self.images} images, {self.seconds:.1f} s, {self.rate:,.0f} images/s, {processes})")
        if self.skipped:
            path, reason = self.skipped[0]
            text += f"; skipped {len(self.skipped)} unreadable (first: {path}: {reason})"
        return text


def _decoder() -> bytes:
    """What the cached pixels were decoded with: Pillow's version and the code of devplug's and the cache's decoder.

    A change to either (a new Pillow, a fix to how 16-bit images are scaled) makes another cache: the pixels of
    the old one are not what the folder decodes to any more.
    """
    import PIL

    from . import decode_pool

    digest = hashlib.sha256(f"Pillow {PIL.__version__}\n".encode())
    for module in (sys.modules[load_rgb.__module__], decode_pool):  # devplug's decoder, and the cache's
        digest.update(Path(module.__file__ or "").read_bytes())
    return digest.digest()


def _cache_key(root: Path, files: list[tuple[Path, int]], image_size: int) -> tuple[str, list[tuple[Path, int]]]:
    """Hash of the decoder, image size and every file's relative path, label, size and mtime; also the stat-able files.

    Paths are hashed as bytes, so file names that are not valid UTF-8 work.
    """
    digest = hashlib.sha256(f"dcgan-cache {CACHE_FORMAT} {image_size}\n".encode() + _decoder())
    kept = []
    for path, label in files:
        try:
            stat = path.stat()
        except OSError:
            continue  # vanished or unreadable: not part of the data set
        kept.append((path, label))
        digest.update(os.fsencode(path.relative_to(root)) + f"\0{label}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest(), kept


def _cache_stem(root: Path, image_size: int) -> str:
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", display_path(root.name)) or "data"
    where = hashlib.sha256(os.fsencode(root)).hexdigest()[:8]
    return f"{name}-{where}-{image_size}px"


def _open_cache(meta_path: Path, key: str, array_path: Path) -> tuple[CachedImages, dict[str, Any]] | None:
    """The cache version ``array_path`` locked for use, if it is complete and was built for ``key``."""
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or meta.get("key") != key or meta.get("format") != CACHE_FORMAT:
        return None
    lock = open_locked(array_path)
    if lock is None:
        return None
    try:
        array = np.load(array_path, mmap_mode="r")
    except (OSError, ValueError):
        lock.close()
        return None
    # Rows of skipped (unreadable) images stay unused at the end of the array.
    if array.shape[0] < len(meta.get("labels", ())) or array.dtype != np.uint8:
        lock.close()
        return None
    return CachedImages(array_path, list(meta["labels"]), lock), meta


def prepare_cache(
    root: str | os.PathLike[str],
    image_size: int,
    cache_dir: str | os.PathLike[str],
    *,
    workers: int | None = None,
    build: bool = True,
    progress: Callable[[int, int], None] | None = None,
    on_wait: Callable[[Path], None] | None = None,
) -> tuple[CachedImages, CacheReport]:
    """The cached data set for ``root`` at ``image_size``, built if missing or stale.

    ``workers`` decode processes build it (``None``: every core; ``0``: this process). ``build=False``
    waits for nothing and builds nothing: it only opens a cache another process (rank 0) has just built.
    When another process is building the same cache, ``on_wait(path)`` is called and this one waits for
    it, then uses its result. Versions of this folder's cache that no process has open any more are
    removed. Raises `devplug.DataError` for a missing or empty folder, a folder with no readable
    image, a cache directory that cannot be written, or a disk without room for the cache.
    """
    root_path = Path(root).expanduser().resolve()
    files = list_images(root_path)
    key, files = _cache_key(root_path, files, image_size)
    if not files:
        raise DataError(f"no image in {display_path(root_path)!r} can be read (all vanished or unreadable)")
    directory = Path(cache_dir).expanduser()
    stem = _cache_stem(root_path, image_size)
    array_path = directory / f"{stem}-{key[:16]}.npy"
    meta_path = array_path.with_suffix(".json")
    opened = _open_cache(meta_path, key, array_path)
    if opened is not None:
        collect_stale(directory, stem, array_path)
        dataset, meta = opened
        return dataset, CacheReport(array_path, len(dataset), built=False, skipped=[tuple(s) for s in meta["skipped"]])
    if not build:
        raise DataError(f"image cache {display_path(array_path)!r} is missing or stale after the main process "
                        "built it")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DataError(f"cannot create the cache directory {display_path(directory)!r}: {exc.strerror or exc}; "
                        "pass --cache-dir") from exc
    collect_stale(directory, stem, array_path)  # frees the space of versions no job uses any more
    # the free space is checked under the build lock (in _build), before anything is decoded or written: a job
    # that finds another building this cache waits and reuses it, and a dead builder's file is cleared first
    with build_lock(directory, stem, on_wait=(lambda: on_wait(array_path)) if on_wait else None):
        opened = _open_cache(meta_path, key, array_path)  # another process may have built it meanwhile
        if opened is not None:
            dataset, meta = opened
            report = CacheReport(array_path, len(dataset), built=False, skipped=[tuple(s) for s in meta["skipped"]])
        else:
            collect_stale(directory, stem, array_path, temporary=True)  # frees the space of unused versions
            dataset, report = _build(root_path, files, image_size, key, array_path, meta_path,
                                     build_workers() if workers is None else workers, progress)
    collect_stale(directory, stem, array_path)
    return dataset, report


def _check_space(array_path: Path, images: int, image_size: int) -> None:
    need = len(npy_header((images, 3, image_size, image_size))) + images * 3 * image_size * image_size
    check_free_space(array_path.parent, need, f"{images:,} images x 3 x {image_size} x {image_size} bytes")


def _build(
    root: Path,
    files: list[tuple[Path, int]],
    image_size: int,
    key: str,
    array_path: Path,
    meta_path: Path,
    workers: int,
    progress: Callable[[int, int], None] | None,
) -> tuple[CachedImages, CacheReport]:
    """Decode ``files`` into a new version at ``array_path`` (called with the build lock held)."""
    start = time.perf_counter()
    shape = (len(files), 3, image_size, image_size)
    _check_space(array_path, len(files), image_size)
    labels: list[int] = []
    skipped: list[tuple[str, str]] = []
    opened = 0
    tmp_path = array_path.with_name(f".{array_path.stem}.{os.getpid()}.tmp.npy")
    # closing(): on an error the decode workers stop now, not when the traceback lets go of the generator
    with CacheWriter(tmp_path, shape) as writer, contextlib.closing(
            decode_files([p for p, _ in files], image_size, workers=workers)) as chunks:
        for chunk in chunks:
            rows = []
            for index, pixels, error in chunk:
                opened += 1
                if pixels is None:
                    skipped.append((display_path(files[index][0].relative_to(root)), error))
                    continue
                rows.append(pixels)
                labels.append(files[index][1])
            if rows:
                writer.write_rows(len(labels) - len(rows), np.stack(rows))
            if progress is not None:
                progress(opened, len(files))
        if not labels:
            first, reason = skipped[0]
            raise DataError(f"none of the {len(files)} images in {display_path(root)!r} can be read "
                            f"(first: {first}: {reason})")
        meta = {"format": CACHE_FORMAT, "key": key, "root": display_path(root), "image_size": image_size,
                "labels": labels, "skipped": skipped}
        lock = writer.commit(array_path)
    try:
        write_text(meta_path, json.dumps(meta))
    except DataError:
        lock.close()
        array_path.unlink(missing_ok=True)
        raise
    report = CacheReport(array_path, len(labels), built=True, opened=opened, skipped=skipped,
                         seconds=time.perf_counter() - start, workers=workers)
    return CachedImages(array_path, labels, lock), report
