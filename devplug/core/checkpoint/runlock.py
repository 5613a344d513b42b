"""The run lock: one job at a time writes a checkpoint folder.

A Trainer with a checkpoint policy takes the lock of the policy's folder before it writes anything (on
the main process; the other ranks of its job hear the answer from it): an advisory ``flock`` on the folder
itself, which the operating system drops when its process ends however it ends, so the lock of a killed
run is taken over by the next one. The holder (host, process id, start time, command) is recorded in the
folder's extended attribute ``user.devplug.lock``, so a second job is refused with one line saying who
holds the folder; nothing is added to the folder. Several Trainers of one process share the lock. Where
the file system takes no lock on a folder, the run goes on without one.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

from devplug.core.checkpoint.tempfiles import writer_alive
from devplug.core.errors import CheckpointError

log = logging.getLogger("devplug")

#: The extended attribute of a locked folder that names its holder.
HOLDER_ATTRIBUTE = "user.devplug.lock"


try:
    import fcntl
except ImportError:  # pragma: no cover - not a POSIX system: no lock
    fcntl = None  # type: ignore[assignment]

_HELD: dict[str, list[Any]] = {}  # folder → [file descriptor, holders in this process]


def read_holder(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """What the folder's lock records about its holder (``{}`` when it records nothing readable)."""
    try:
        found = json.loads(os.getxattr(os.fspath(folder), HOLDER_ATTRIBUTE).decode())
        return found if isinstance(found, dict) else {}
    except (OSError, ValueError, AttributeError):  # no attribute, none supported, or not Linux
        return {}


def describe_holder(holder: dict[str, Any]) -> str:
    """``host <h>, pid <p>, started <time> (<command>)`` for a lock file's content, as far as it says."""
    if not holder:
        return "a process that left no name"
    text = f"host {holder.get('host', '?')}, pid {holder.get('pid', '?')}, started {holder.get('started', '?')}"
    command = " ".join(str(holder.get("command", "")).split())[:120]
    return f"{text} ({command})" if command else text


class RunLock:
    """This process's hold on a folder's run lock (`acquire`); `release` lets go once every holder has."""

    def __init__(self, key: str, folder: Path) -> None:
        self._key, self.folder, self.released = key, folder, False

    def release(self) -> None:
        """Let go of the lock (the file stays; the next run takes it over)."""
        if self.released:
            return
        self.released = True
        held = _HELD.get(self._key)
        if held is None:
            return
        held[1] -= 1
        if held[1] <= 0:
            del _HELD[self._key]
            os.close(held[0])  # closing the descriptor drops the flock


#: Seconds to wait for the lock of a holder that is gone: its children (data loader workers, which share
#: the lock) end within a few seconds of it.
ORPHAN_WAIT = 15.0


def _gone(holder: dict[str, Any]) -> bool:
    pid = holder.get("pid")
    return holder.get("host") == socket.gethostname() and isinstance(pid, int) and not writer_alive(pid)


def _take(fd: int, root: Path) -> None:
    """``flock`` the folder; while its recorded holder is a process of this host that is gone, wait a little."""
    deadline = time.monotonic() + ORPHAN_WAIT
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline or not _gone(read_holder(root)):
                raise
            time.sleep(0.2)


def acquire(folder: str | os.PathLike[str]) -> RunLock | None:
    """Take the run lock of ``folder`` (created if needed); a `CheckpointError` line naming the holder if taken.

    Returns ``None`` when no lock can be taken here (a read-only folder, a system without ``flock``): the
    run goes on, and its saves report what is wrong with the folder. A file where the folder (or a folder
    above it) should be is a `CheckpointError` line now: no save could ever be written.
    """
    root = Path(folder)
    try:
        root.mkdir(parents=True, exist_ok=True)
        key = str(root.resolve())
    except (FileExistsError, NotADirectoryError):
        blocker = next((p for p in (root, *root.parents) if p.exists() and not p.is_dir()), root)
        raise CheckpointError(f"cannot make the checkpoint folder {str(root)!r}: {str(blocker)!r} is a file, not a "
                              "folder; give the checkpoint policy a folder's path") from None
    except OSError as exc:
        log.debug("no run lock in %s: %s", root, exc)
        return None
    if key in _HELD:
        _HELD[key][1] += 1
        return RunLock(key, root)
    if fcntl is None:
        return None
    try:
        fd = os.open(root, os.O_RDONLY)
    except OSError as exc:
        log.debug("no run lock in %s: %s", root, exc)
        return None
    try:
        _take(fd, root)
    except BlockingIOError:
        os.close(fd)
        holder = read_holder(root)
        gone = " (its process is gone; a child of it still holds the folder)" if _gone(holder) else ""
        raise CheckpointError(f"another run is writing {str(root)!r}: {describe_holder(holder)}{gone}; wait "
                              "for it to finish or stop it, or give this run another output folder") from None
    except OSError as exc:  # a file system that takes no lock on a folder
        os.close(fd)
        log.debug("no run lock in %s: %s", root, exc)
        return None
    previous = read_holder(root)
    if previous and previous.get("pid") != os.getpid():
        log.info("took over the run lock of %s in %s (that process is gone)", describe_holder(previous), root)
    me = {"host": socket.gethostname(), "pid": os.getpid(),
          "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
          "command": " ".join(sys.argv)[:500]}
    try:
        os.setxattr(root, HOLDER_ATTRIBUTE, json.dumps(me).encode())
    except (OSError, AttributeError) as exc:  # no extended attributes here: the flock holds all the same
        log.debug("the run lock of %s does not name its holder: %s", root, exc)
    _HELD[key] = [fd, 1]
    return RunLock(key, root)


def hold_for_run(folder: str | os.PathLike[str] | None, *, main: bool, combiner: Any = None) -> RunLock | None:
    """Take ``folder``'s run lock on the main process; every rank raises the same `CheckpointError` if taken.

    ``combiner`` (the ranks' object collectives, ``None`` in one process) carries rank 0's answer to the others.
    """
    lock, problem = None, ""
    if folder is not None and main:
        try:
            lock = acquire(folder)
        except CheckpointError as exc:
            problem = str(exc)
    if combiner is not None and folder is not None:
        problem = combiner.broadcast(problem, source=0)
    if problem:
        raise CheckpointError(problem)
    return lock
