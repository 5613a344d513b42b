"""Writing an image cache file so that no fault corrupts or strands it.

- **Space first.** The size of a cache is known before the build (images × 3 × S × S bytes plus the
  ``.npy`` header), so `check_free_space` refuses a build the disk cannot hold, with one line
  giving the need, the free space and ``--cache-dir``.
- **Allocated for real.** `CacheWriter` reserves every block with ``posix_fallocate`` (not a
  sparse file) and writes rows with ``pwrite``, never through a writable memory map: running out of
  space is an ``OSError`` (→ `devplug.DataError`), never a ``SIGBUS``. A failed build removes
  its temporary file.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import io
import os
import shutil
from pathlib import Path
from typing import IO

import numpy as np

from devplug import DataError
from devplug.toolkit import display_path, human_bytes

#: Errors of ``posix_fallocate`` that mean "not supported here", not "no space": the build then goes on
#: without reserving (writes still fail cleanly with ENOSPC).
_NO_FALLOCATE = {errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}


def npy_header(shape: tuple[int, ...]) -> bytes:
    """The ``.npy`` (format 1.0) header of a C-ordered uint8 array of ``shape``."""
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, {"descr": "|u1", "fortran_order": False, "shape": shape})
    return buffer.getvalue()


def check_free_space(directory: Path, need: int, what: str) -> None:
    """Raise `DataError` when ``directory``'s file system has less than ``need`` bytes free."""
    free = shutil.disk_usage(directory).free
    if free < need:
        raise DataError(
            f"not enough disk space for the image cache: it needs {human_bytes(need)} ({what}) in "
            f"{display_path(directory)!r}, which has {human_bytes(free)} free; free some space or pass --cache-dir "
            "on a disk with room (or --no-cache to decode every epoch)"
        )


def disk_full(path: Path, exc: OSError) -> DataError:
    """The one-line error for a write that failed (ENOSPC and EDQUOT say 'disk full')."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return DataError(f"the disk filled up while writing the image cache {display_path(path)!r} "
                         f"({exc.strerror}); nothing was kept; free some space or pass --cache-dir on a disk "
                         "with room (or --no-cache to decode every epoch)")
    return DataError(f"cannot write the image cache {display_path(path)!r}: {exc.strerror or exc}; "
                     "pass --cache-dir on a writable disk")


class CacheWriter:
    """A new ``.npy`` file of ``shape`` uint8 rows at ``path``, fully allocated, filled row by row.

    Use as a context manager: on an exception the file is removed; `commit` makes it durable and
    renames it to ``final`` atomically.
    """

    def __init__(self, path: Path, shape: tuple[int, ...]) -> None:
        self.path = path
        self.shape = shape
        self.row_bytes = int(np.prod(shape[1:]))
        header = npy_header(shape)
        self.offset = len(header)
        self.size = self.offset + shape[0] * self.row_bytes
        try:
            self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise disk_full(path, exc) from None
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX)  # a live build's temporary file is never collected
            _reserve(self.fd, self.size)
            self._write(header, 0)
        except OSError as exc:
            self.discard()
            raise disk_full(path, exc) from None
        except BaseException:
            self.discard()
            raise

    def __enter__(self) -> CacheWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if exc_info[0] is not None:
            self.discard()

    def _write(self, data: bytes | memoryview, position: int) -> None:
        view = memoryview(data)
        try:
            while view:
                written = os.pwrite(self.fd, view, position)
                view, position = view[written:], position + written
        except OSError as exc:
            raise disk_full(self.path, exc) from None

    def write_rows(self, first: int, rows: np.ndarray) -> None:
        """Write ``rows`` (uint8, each of ``shape[1:]``) as rows ``first, first + 1, ...``."""
        self._write(np.ascontiguousarray(rows, dtype=np.uint8).data.cast("B"), self.offset + first * self.row_bytes)

    def commit(self, final: Path) -> IO[bytes]:
        """Flush to disk and rename to ``final`` (atomically replacing any file there).

        Returns the file opened for reading with a shared lock held: the new version is in use from the
        moment it has its name, so no other process's `collect_stale` can remove it.
        """
        try:
            os.fsync(self.fd)
            os.replace(self.path, final)
            fcntl.flock(self.fd, fcntl.LOCK_SH)
        except OSError as exc:
            self.discard()
            raise disk_full(self.path, exc) from None
        handle = os.fdopen(self.fd, "rb")
        self.fd = -1
        return handle

    def discard(self) -> None:
        """Close and remove the temporary file (idempotent)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()


def _reserve(fd: int, size: int) -> None:
    """Allocate ``size`` bytes on disk for ``fd`` (no sparse holes left to fault on later)."""
    if not hasattr(os, "posix_fallocate"):
        return
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno not in _NO_FALLOCATE:
            raise


def write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (temporary file, fsync, rename); `DataError` on failure."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise disk_full(path, exc) from None
