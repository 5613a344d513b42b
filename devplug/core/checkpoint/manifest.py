"""The manifest of a sharded checkpoint folder: every file's size and digest, written last, checked on load.

A sharded checkpoint is several files (DCP's shards and ``.metadata``, devplug's ``trainer.pt``) that only
mean something together. Once all are written, the saving process lists each with its size and SHA-256
digest in ``manifest.json`` (written atomically, the last file of the save), so a bit flip in a shard, a
truncated or missing file, a shard or state file copied in from another checkpoint, or a file added later
is found before anything is restored, and reported as one line saying the checkpoint is damaged.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from devplug.core.errors import CheckpointError

#: The manifest's file name inside a sharded checkpoint folder.
MANIFEST_FILE = "manifest.json"
#: Files inside a checkpoint folder that are not part of the checkpoint (the name of the process writing it).
NOT_LISTED = frozenset({MANIFEST_FILE, ".writer"})
FORMAT = 1
ALGORITHM = "sha256"  # with the CPU's SHA instructions, about twice as fast as BLAKE2b here
_CHUNK = 1 << 20


def file_digest(path: Path) -> str:
    """The SHA-256 digest (hex) of the file ``path``'s bytes."""
    hasher = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            hasher.update(chunk)
    return hasher.hexdigest()


def _listed(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.name not in NOT_LISTED and p.is_file())


def write_manifest(folder: str | os.PathLike[str]) -> Path:
    """List every file of the checkpoint ``folder`` with its size and digest in its manifest (atomically)."""
    root = Path(folder)
    entries = {p.name: {"size": p.stat().st_size, ALGORITHM: file_digest(p)} for p in _listed(root)}
    body = json.dumps({"format": FORMAT, "files": entries}, indent=1, sort_keys=True)
    temp = root / f".{MANIFEST_FILE}.{os.getpid()}.tmp"
    try:
        with temp.open("w") as handle:
            handle.write(body)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, root / MANIFEST_FILE)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    return root / MANIFEST_FILE


def _read(root: Path, where: str) -> dict[str, Any]:
    try:
        manifest = json.loads((root / MANIFEST_FILE).read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{where} is damaged: it has no {MANIFEST_FILE} (a file was removed, or it was "
                              "written by a devplug that did not list its files); use an earlier checkpoint") from None
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{where} is damaged: its {MANIFEST_FILE} cannot be read "
                              f"({type(exc).__name__}); use an earlier checkpoint") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointError(f"{where} is damaged: its {MANIFEST_FILE} is not one devplug writes")
    files = manifest.get("files")
    if not isinstance(files, dict) or not all(
            isinstance(name, str) and os.sep not in name and name not in ("", ".", "..")
            and isinstance(entry, dict) and isinstance(entry.get("size"), int)
            and isinstance(entry.get(ALGORITHM), str) for name, entry in files.items()):
        raise CheckpointError(f"{where} is damaged: its {MANIFEST_FILE} is not one devplug writes")
    return files


#: Folders whose files this process has hashed and found intact, with each file's size, mtime and inode then:
#: checking the same unchanged files again (a resume checks its candidate, then loads it) hashes nothing.
_VERIFIED: dict[str, tuple[tuple[str, int, int, int], ...]] = {}


def check_manifest(folder: str | os.PathLike[str]) -> None:
    """Raise a one-line "damaged" `CheckpointError` unless every file of ``folder`` is the one its manifest lists.

    Sizes are compared first (cheap: a truncated or missing file is found without reading anything), then
    each file's digest.
    """
    root = Path(folder)
    where = f"sharded checkpoint {str(root)!r}"
    files = _read(root, where)
    present = {p.name: p for p in _listed(root)}
    missing = sorted(set(files) - set(present))
    if missing:
        raise CheckpointError(f"{where} is damaged: {', '.join(missing[:3])} listed in its {MANIFEST_FILE} "
                              f"{'is' if len(missing) == 1 else 'are'} missing; use an earlier checkpoint")
    extra = sorted(set(present) - set(files))
    if extra:
        raise CheckpointError(f"{where} is damaged: it holds {', '.join(extra[:3])}, not listed in its "
                              f"{MANIFEST_FILE} (copied in from elsewhere?); use an earlier checkpoint")
    stats = {name: present[name].stat() for name in files}
    seen = (str(root.resolve()),
            tuple((name, st.st_size, st.st_mtime_ns, st.st_ino) for name, st in sorted(stats.items())))
    if _VERIFIED.get(seen[0]) == seen[1]:
        return  # this process hashed exactly these files already (a resume's choice, then its load)
    resized = [name for name, entry in sorted(files.items()) if stats[name].st_size != entry["size"]]
    changed = resized or [name for name, entry in sorted(files.items())
                          if file_digest(present[name]) != entry[ALGORITHM]]
    if changed:
        how = "has a different size than" if resized else "does not match the digest in"
        raise CheckpointError(f"{where} is damaged: {changed[0]} {how} its {MANIFEST_FILE} (changed on disk or "
                              "in transfer, or taken from another checkpoint); use an earlier checkpoint")
    _VERIFIED[seen[0]] = seen[1]
