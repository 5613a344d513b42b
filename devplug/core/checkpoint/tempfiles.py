"""Temporary files of checkpoint saves: named after their writer, removed once that writer is gone.

A save writes ``.<name>.<host>.<pid>.<token>.tmp`` beside its target and renames it over the target when
complete. A process killed mid-save leaves its temporary file behind; the next save in the folder (or
`remove_stale_temp_files`, which the same code path uses) deletes the temporary files whose writer
ran on this host and is no longer alive. A sharded save's staging folder, ``.<name>.partial``, names its
writer in a ``.writer`` file inside it (`tag_writer`) and is removed the same way (by the age of its newest
file where that writer cannot be told gone, or where a save killed at once named none).

Whether the writer of another temporary file is alive cannot be told from its pid: one named after another
host (a shared file system, or a container or pod restarted under a new host name), one whose pid is alive
again (a container's training process is pid 1 after every restart), and those of earlier devplug versions,
which name no host (``.checkpoints.json.<pid>.tmp``, ``.step_<N>.pt.<8 random characters>.tmp``). They go
by age instead: such a file is removed once it has gone unmodified for `ABANDONED_AGE_S` while the folder
was written after it. Its writer streams the file and renames it at once, so an hour without a byte
written means it is gone; the age is read on the file system's own clock (the newest modification in the
folder), so a host whose clock is off, or a folder left untouched for a week, never makes a young file
look old.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import socket
from pathlib import Path

_PATTERN = re.compile(r"^\.(?P<target>.+)\.(?P<host>[A-Za-z0-9_-]+)\.(?P<pid>\d+)\.(?P<token>[0-9a-f]{8})\.tmp$")
_STAGING = re.compile(r"^\.(?P<target>.+)\.partial$")
_LEGACY = re.compile(r"^\.(?:checkpoints\.json\.\d+|step_\d+\.pt\.[a-z0-9_]{8})\.tmp$")
#: How long (seconds, on the file system's clock) a temporary file whose writer cannot be told gone by its pid
#: must have gone unmodified while its folder was written after it before it counts as abandoned.
ABANDONED_AGE_S = 3600.0
#: The file inside a staging folder that names the process writing it: ``<host> <pid>``.
WRITER_FILE = ".writer"


def host_tag() -> str:
    """This host's name as it appears in temporary file names (letters, digits, ``-`` and ``_`` only)."""
    return re.sub(r"[^A-Za-z0-9_-]", "-", socket.gethostname()) or "host"


def create_temp(target: Path) -> tuple[int, Path]:
    """Create a new temporary file for ``target`` in its folder; its descriptor (open for writing) and path.

    The file is created with mode 0666 less the process umask, like every other file a program writes.
    """
    while True:
        path = target.parent / f".{target.name}.{host_tag()}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        try:
            return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666), path
        except FileExistsError:  # pragma: no cover - 32 random bits collided
            continue


def tag_writer(folder: Path) -> None:
    """Name this process as the writer of the staging folder ``folder`` (so a later run can tell it is stale)."""
    (folder / WRITER_FILE).write_text(f"{host_tag()} {os.getpid()}\n")


def _staging_writer(folder: Path) -> tuple[str, int] | None:
    """The ``(host, pid)`` a staging folder names as its writer; ``None`` when it names none readable."""
    try:
        host, pid = (folder / WRITER_FILE).read_text().split()
        return host, int(pid)
    except (OSError, ValueError):
        return None


def writer_alive(pid: int) -> bool:
    """True when process ``pid`` of this host may still be running (a zombie counts as gone)."""
    if os.name == "nt":  # os.kill would terminate it there: never call a file stale
        return True
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # it exists, owned by someone else
        return True
    try:
        status = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return status.rpartition(")")[2].split()[:1] != ["Z"]


def _newest_write(folder: Path, entries: list[Path]) -> float:
    """The newest modification time in ``folder`` (itself and its entries), on the file system's clock."""
    times = []
    for path in [folder, *entries]:
        try:
            times.append(path.stat().st_mtime)
        except OSError:  # removed meanwhile
            continue
    return max(times, default=0.0)


def _abandoned(path: Path, newest: float) -> bool:
    """True for a temporary file left unmodified `ABANDONED_AGE_S` before ``newest``."""
    try:
        return path.is_file() and newest - path.stat().st_mtime > ABANDONED_AGE_S
    except OSError:
        return False


def _abandoned_folder(path: Path, newest: float) -> bool:
    """True for a staging folder none of whose files (nor itself) was modified `ABANDONED_AGE_S` before ``newest``."""
    try:
        written = max(entry.stat().st_mtime for entry in [path, *path.iterdir()])
    except (OSError, ValueError):
        return False
    return newest - written > ABANDONED_AGE_S


def remove_stale_temp_files(folder: str | os.PathLike[str]) -> list[Path]:
    """Delete the temporary files of checkpoint saves in ``folder`` whose writing process is gone; the paths removed.

    Only files named by devplug are removed: at once those of a process on this host that is no longer
    running; those whose writer may be alive (another host, a live pid, an earlier devplug version, which
    named no host) once they have gone unmodified for an hour while the folder was written after them (see
    the module's notes). Files of other programs are kept. The staging folders of sharded saves
    (``.<name>.partial``) go by the writer named inside them, and by the same age (that of their newest file)
    where it cannot be told gone or is not named.
    """
    here = host_tag()
    removed: list[Path] = []
    try:
        entries = list(Path(folder).iterdir())
    except OSError:
        return removed
    newest: float | None = None
    for path in entries:
        if _STAGING.match(path.name) and path.is_dir():
            writer = _staging_writer(path)
            if writer is None or writer[0] != here or writer_alive(writer[1]):  # by its age, as below
                newest = _newest_write(Path(folder), entries) if newest is None else newest
                if not _abandoned_folder(path, newest):
                    continue
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
            continue
        match = _PATTERN.match(path.name)
        if match is None and not _LEGACY.match(path.name):
            continue  # not a name devplug writes
        if match is None or match["host"] != here or writer_alive(int(match["pid"])):
            # its writer cannot be told gone by its pid (another host, a pid alive again, an earlier version):
            # by its age, on the file system's clock
            newest = _newest_write(Path(folder), entries) if newest is None else newest
            if not _abandoned(path, newest):
                continue
        try:
            path.unlink()
        except FileNotFoundError:  # another process tidied it first
            continue
        except OSError:
            continue
        removed.append(path)
    return removed
