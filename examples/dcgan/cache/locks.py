"""Cache versions and the locks that keep a version in use from being deleted.

Each cache version is its own file, named by the key of the folder it was built from. A process using a
version holds a shared ``flock`` on it (`open_locked`); a version is deleted only by someone who
gets the exclusive lock, i.e. once nobody uses it (`collect_stale`). Builders of one folder at one
size take turns through an exclusive lock on ``.<stem>.lock`` (`build_lock`), so two jobs starting
at once build one cache, and a temporary file found while holding that lock belongs to a builder that
died: it is removed.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

from devplug import DataError
from devplug.toolkit import display_path


def open_locked(path: Path) -> IO[bytes] | None:
    """``path`` opened for reading with a shared lock held (released when the file is closed).

    ``None`` when it does not exist, or was replaced or removed while the lock was being taken.
    """
    try:
        handle = open(path, "rb")  # kept open: the lock lives as long as the file
    except OSError:
        return None
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_SH)
        if os.fstat(handle.fileno()).st_ino != os.stat(path).st_ino:
            raise FileNotFoundError(path)
    except OSError:
        handle.close()
        return None
    return handle


@contextlib.contextmanager
def build_lock(directory: Path, stem: str, on_wait: Callable[[], None] | None = None) -> Iterator[None]:
    """Hold the exclusive build lock of ``stem`` in ``directory``; ``on_wait()`` runs once if another holds it."""
    path = directory / f".{stem}.lock"
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise DataError(f"cannot create the image cache lock {display_path(path)!r}: {exc.strerror}; "
                        "pass --cache-dir on a writable disk") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait is not None:
                on_wait()
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def collect_stale(directory: Path, stem: str, keep: Path, *, temporary: bool = False) -> list[Path]:
    """Remove the versions of ``stem`` other than ``keep`` that no process has open; return what was removed.

    A version in use (shared-locked) stays for a later call; this never blocks. ``temporary=True`` also
    removes temporary files of ``stem``: call it only while holding `build_lock`, when every such
    file belongs to a builder that died.
    """
    removed: list[Path] = []
    try:
        versions = sorted(directory.glob(f"{stem}-*.npy"))
        orphans = [p for p in directory.glob(f"{stem}-*.json") if not p.with_suffix(".npy").exists()]
        temporaries = sorted(directory.glob(f".{stem}-*.tmp*")) if temporary else []
    except OSError:
        return removed
    for path in versions:
        if path != keep and _remove_unused(path):
            path.with_suffix(".json").unlink(missing_ok=True)
            removed.append(path)
    for path in [*orphans, *temporaries]:
        if path != keep.with_suffix(".json") and _remove_unused(path):
            removed.append(path)
    return removed


def _remove_unused(path: Path) -> bool:
    """Delete ``path`` if no process holds a lock on it; True if it was deleted."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if os.fstat(fd).st_ino != os.stat(path).st_ino:
            return False  # replaced since it was opened
        path.unlink()
        return True
    except OSError:
        return False  # in use (locked), or already gone
    finally:
        os.close(fd)
