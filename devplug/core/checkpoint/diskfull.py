"""Recognising a full disk (or an exhausted quota) in whatever form a write reports it.

Python's own writes raise ``OSError`` with ``ENOSPC``/``EDQUOT``; torch's zip writer raises a
``RuntimeError`` ("unexpected pos") with that ``OSError`` only in ``__context__``; the checkpoint library
(DCP) raises a ``CheckpointException`` (a ``BaseException``) holding each rank's exception; some writers
say "No space left on device" in their message only. `disk_full_cause` finds it in any of them, so every
write path can turn a full disk into its one documented line.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

#: The error numbers of a full disk and of an exhausted quota.
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
_WORDS = {os.strerror(code): code for code in DISK_FULL}


def disk_full_cause(exc: BaseException | None) -> OSError | None:
    """The ``OSError`` saying the disk (or quota) is full behind ``exc``, or ``None`` when it is another failure.

    Looks through ``__cause__`` and ``__context__`` and through DCP's per-rank failures; an error whose
    message alone names a full disk gives an ``OSError`` made from it.
    """
    stack, seen = [exc], set()
    while stack:
        current = stack.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in DISK_FULL:
            return current
        text = str(current)
        for words, code in _WORDS.items():
            if words in text:
                return OSError(code, words)
        failures = getattr(current, "failures", None)  # DCP: {rank: (exception, traceback)} or {rank: exception}
        if isinstance(failures, dict):
            stack += [value[0] if isinstance(value, tuple) else value for value in failures.values()]
        stack += [current.__cause__, current.__context__]
    return None


def disk_full_line(what: str, exc: OSError) -> str:
    """``the disk is full: could not write <what> (<reason>)``: the start of every full-disk message."""
    reason = exc.strerror or os.strerror(exc.errno or errno.ENOSPC)
    return f"the disk is full: could not write {what} ({reason})"


def write_atomically(path: str | os.PathLike[str], write: Callable[[BinaryIO], object]) -> Path:
    """Write ``path`` through ``write(handle)`` into a temporary file beside it, then rename it into place.

    A failed write (a full disk) leaves no partial file and no temporary one: the path holds the whole
    previous content or the whole new one. The file gets the usual permissions (0666 less the umask). The
    temporary files that writers killed in this folder left (their process gone) are removed first, so they
    never accumulate in a run's folder of samples or summaries.
    """
    from devplug.core.checkpoint.tempfiles import create_temp, remove_stale_temp_files  # loaded at the first write

    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temp_files(target.parent)
    fd, temporary = create_temp(target)  # named after this process: a folder's sweep removes it if the process dies
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return target
