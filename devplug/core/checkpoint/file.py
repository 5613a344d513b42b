"""Atomic, device-portable, self-checking checkpoint files.

A checkpoint is written to a temporary file beside the target (named after its writer's host and pid,
created with the process umask like any other output), flushed and fsynced, then renamed over the
target, so a crash mid-save leaves the previous checkpoint intact; each save first removes the
temporary files of earlier saves whose process is gone. Every tensor is moved to the CPU first, so a
checkpoint made on one device loads on another. The state carries a content digest
(`.digest`), checked on every read: a file that cannot be read is one `CheckpointError`
line saying what the file looks like.
"""

from __future__ import annotations

import os
import pickle
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from devplug.core.checkpoint import digest as content
from devplug.core.checkpoint import sniff
from devplug.core.checkpoint.diskfull import disk_full_cause
from devplug.core.checkpoint.tempfiles import create_temp, remove_stale_temp_files
from devplug.core.errors import CheckpointError
from devplug.core.tree import map_tensors

#: Version of the checkpoint layout. 2: canonical optimizer state, content digest.
FORMAT_VERSION = 2
#: Top-level keys every checkpoint of this format has.
REQUIRED_KEYS = ("format", "digest", "device", "precision", "global_step", "epoch", "batches_in_epoch",
                 "world_size", "loaders", "modules", "optimizers", "scaler", "rng", "extra")


def to_cpu(state: Any) -> Any:
    """A copy of ``state`` with every tensor detached and moved to the CPU."""
    return map_tensors(state, lambda t: t.detach().cpu())


def with_digest(state: Mapping[str, Any]) -> dict[str, Any]:
    """``state`` with its ``digest`` entry set to the content digest of everything else."""
    body = {k: v for k, v in state.items() if k != "digest"}
    return {**body, "digest": content.digest(body)}


def _holds_set(obj: Any) -> bool:
    if isinstance(obj, (set, frozenset)):
        return True
    if isinstance(obj, Mapping):
        return any(_holds_set(key) or _holds_set(value) for key, value in obj.items())
    return isinstance(obj, (list, tuple)) and any(_holds_set(value) for value in obj)


def _digest_with_sets_in_order(state: Mapping[str, Any]) -> bool:
    """True when ``state``'s digest is the one an earlier devplug wrote, taking sets in their order then."""
    body = {k: v for k, v in state.items() if k != "digest"}
    return _holds_set(body) and content.digest(body, sets_in_order=True) == state["digest"]


def atomic_save(state: Any, path: str | os.PathLike[str]) -> Path:
    """Write ``state`` with ``torch.save`` to ``path`` atomically (temp file, fsync, rename).

    Removes stale temporary files of dead writers in the folder first, so at most one (this save's) exists.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temp_files(target.parent)
    fd, tmp = create_temp(target)
    try:
        with os.fdopen(fd, "wb") as handle:
            torch.save(state, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        full = disk_full_cause(exc) if isinstance(exc, Exception) else None
        if full is not None and full is not exc:  # torch's zip writer says "unexpected pos", the cause inside
            raise OSError(full.errno, full.strerror, str(target)) from None
        raise
    try:  # make the rename itself durable
        dir_fd = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError:
        pass
    return target


_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def one_line(text: str, limit: int | None = None) -> str:
    """``text`` as one plain line: terminal escape sequences removed, whitespace runs made one space."""
    plain = " ".join(_ANSI.sub("", text).split())
    return plain if limit is None else plain[:limit]


def _torch_reason(exc: BaseException) -> str:
    """torch's reason in a few words, without its advice to retry with ``weights_only=False``."""
    lines = [line.strip() for line in _ANSI.sub("", str(exc)).splitlines() if line.strip()]
    detail = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("WeightsUnpickler error")), "")
    if detail:
        return f"it holds something other than tensors and plain values ({detail})"
    first = lines[0] if lines else type(exc).__name__
    if "weights_only" in first.lower() or "weights only" in first.lower():
        return "it holds something other than tensors and plain values"
    return first.split(". ")[0][:200]


def _load(source: Path) -> Any:
    where = f"checkpoint {str(source)!r}"
    if source.is_dir():
        raise CheckpointError(f"{where} is a folder, not a file")
    if not source.is_file():
        raise CheckpointError(f"{where} does not exist")
    reason = sniff.unreadable_reason(source)
    if reason:
        raise CheckpointError(f"{where} {reason}")
    try:
        return torch.load(source, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for a damaged file (RuntimeError, UnicodeDecodeError, ...)
        kind = "damaged" if isinstance(exc, (RuntimeError, OSError, EOFError, UnicodeDecodeError)) else "unreadable"
        if isinstance(exc, pickle.UnpicklingError):
            kind = "damaged, or not a devplug checkpoint"
        raise CheckpointError(f"{where} is {kind}: torch cannot read it ({_torch_reason(exc)})") from exc


def read_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Load a devplug checkpoint onto the CPU and check its digest, or raise a one-line `CheckpointError`."""
    source = Path(path)
    where = f"checkpoint {str(source)!r}"
    state = _load(source)
    if not isinstance(state, dict) or "format" not in state:
        what = f"a dict with keys {sorted(map(str, state))[:6]}" if isinstance(state, dict) else type(state).__name__
        raise CheckpointError(f"{where} is not a devplug checkpoint (a torch file holding {what}); "
                              "write checkpoints with Trainer.save()")
    version = state["format"]
    if not isinstance(version, int) or isinstance(version, bool):
        raise CheckpointError(f"{where} is not a devplug checkpoint (its format is {version!r})")
    if version < FORMAT_VERSION:
        raise CheckpointError(f"{where} was written by an older devplug (checkpoint format {version}; this devplug "
                              f"reads format {FORMAT_VERSION}): resume with the devplug release that wrote it")
    if version > FORMAT_VERSION:
        raise CheckpointError(f"{where} was written by a newer devplug (checkpoint format {version}; this devplug "
                              f"reads up to {FORMAT_VERSION}): upgrade devplug (pip install -U devplug)")
    missing = [key for key in REQUIRED_KEYS if key not in state]
    if missing:
        raise CheckpointError(f"{where} is incomplete: it lacks {', '.join(missing)} (edited, or not written by "
                              "Trainer.save())")
    if with_digest(state)["digest"] != state["digest"] and not _digest_with_sets_in_order(state):
        raise CheckpointError(f"{where} is damaged: its content does not match the digest it was saved with "
                              "(changed on disk or in transfer); use an earlier checkpoint")
    return state
