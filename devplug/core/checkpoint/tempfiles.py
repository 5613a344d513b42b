"""Temporary files of checkpoint saves: named after their writer, removed once that writer is gone.

A save writes ``.<name>.<host>.<pid>.<token>.tmp`` beside its target and renames it over the target when
complete. A process killed mid-save leaves its temporary file behind; the next save in the folder (or
`remove_stale_temp_files`, which the same code path uses) deletes the temporary files whose writer
ran on this host and is no longer alive, and never those of a live process or of another host. A sharded
save's staging folder, ``.<name>.partial``, names its writer in a ``.writer`` file inside it
(`tag_writer`) and is removed the same way.

Earlier devplug versions named temporary files without their host: ``.checkpoints.json.<pid>.tmp`` (the
policy's index) and ``.step_<N>.pt.<8 random characters>.tmp`` (a checkpoint). Whether their writer is
alive cannot be told (the pid may be another host's, on a shared file system), so they go by age instead:
such a file is removed once it has gone unmodified for `LEGACY_AGE_S` while the folder was written after
it. Its writer wrote a few hundred bytes (or streamed a checkpoint) and renamed the file at once, so an
hour without a byte written means it is gone; the age is read on the file system's own clock (the newest
modification in the folder), so a host whose clock is off, or a folder left untouched for a week, never
makes a young file look old.
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
#: How long (seconds, on the file system's clock) an earlier version's temporary file must have gone
#: unmodified while its folder was written after it before it counts as abandoned.
LEGACY_AGE_S = 3600.0
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


def _abandoned_legacy(path: Path, newest: float) -> bool:
    """True for an earlier version's temporary file left unmodified `LEGACY_AGE_S` before ``newest``."""
    try:
        return path.is_file() and newest - path.stat().st_mtime > LEGACY_AGE_S
    except OSError:
        return False


def remove_stale_temp_files(folder: str | os.PathLike[str]) -> list[Path]:
    """Delete the temporary files of checkpoint saves in ``folder`` whose writing process is gone; the paths removed.

    Only files named by devplug for a process on this host that is no longer running are removed; those
    of a live process, of another host or of another program are kept. The staging folders of sharded
    saves (``.<name>.partial``) go by the same rule, by the writer named inside them; one that names none
    is kept. The temporary files of earlier devplug versions, which name no host, are removed once they
    have gone unmodified for an hour while the folder was written after them (see the module's notes).
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
            if writer is not None and writer[0] == here and not writer_alive(writer[1]):
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
            continue
        if _LEGACY.match(path.name):
            newest = _newest_write(Path(folder), entries) if newest is None else newest
            if not _abandoned_legacy(path, newest):
                continue
        else:
            match = _PATTERN.match(path.name)
            if match is None or match["host"] != here or writer_alive(int(match["pid"])):
                continue
        try:
            path.unlink()
        except FileNotFoundError:  # another process tidied it first
            continue
        except OSError:
            continue
        removed.append(path)
    return removed
