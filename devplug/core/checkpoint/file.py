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

import io
import os
import pickle
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from devplug.core.checkpoint import digest as content
from devplug.core.checkpoint import sniff
from devplug.core.checkpoint.diskfull import disk_full_cause, write_atomically
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


#: torch's own save, for the check in memory (not the name ``torch.save``, which a profiler or test may wrap)
_save_in_memory = torch.serialization.save


def refused_on_load(value: Any) -> list[str] | None:
    """What in ``value`` ``torch.load(weights_only=True)`` would refuse to read back: the classes and functions
    its pickle names (``pathlib.PosixPath``, ``numpy.dtype``...); ``None`` when it reads back.

    Only the structure is checked: every tensor stands in as ``None``, so no tensor data is copied.
    """
    try:
        skeleton = map_tensors(value, lambda _tensor: None)
        buffer = io.BytesIO()
        _save_in_memory(skeleton, buffer)
    except OSError:  # not the value's fault (nothing is written to a disk here)
        raise
    except Exception as exc:  # a value that cannot even be copied or pickled
        return [f"something that cannot be pickled ({type(exc).__name__}: {one_line(str(exc), 120)})"]
    buffer.seek(0)
    try:
        torch.load(buffer, map_location="cpu", weights_only=True)
    except Exception:  # torch raises UnpicklingError or others for a refused global
        buffer.seek(0)
        return list(torch.serialization.get_unsafe_globals_in_checkpoint(buffer)) or ["a value torch refuses"]
    return None


def refuse_unreadable(state: Any, path: str | os.PathLike[str]) -> None:
    """Raise a one-line `CheckpointError` when ``state`` holds something a load could not read back.

    A checkpoint is read with ``torch.load(weights_only=True)``; a numpy number, a ``Path`` or an object of
    the author's in ``extra`` would make every load of it fail, so nothing is written and the message names
    the entry of ``extra`` (or the part of the state) that holds it.
    """
    refused = refused_on_load(state)
    if refused is None:
        return
    where = "it"
    if isinstance(state, Mapping):
        extra = state.get("extra")
        parts = [(f"extra {key!r}", value) for key, value in extra.items()] if isinstance(extra, Mapping) else []
        parts += [(repr(key), value) for key, value in state.items() if key != "extra"]
        where = next((name for name, value in parts if refused_on_load(value) is not None), where)
    raise CheckpointError(f"cannot save checkpoint {str(path)!r}: {where} holds {', '.join(refused[:3])}, which "
                          "torch.load(weights_only=True) does not read back, so the checkpoint could never be "
                          "loaded; store it as a tensor or a plain Python value (number, string, list, dict)")


def atomic_save(state: Any, path: str | os.PathLike[str]) -> Path:
    """Write ``state`` with ``torch.save`` to ``path`` atomically (`write_atomically`: temp file, rename; here
    the file is fsynced before the rename and the rename after it).

    A state that a load could not read back is refused before anything is written (`refuse_unreadable`).
    """
    refuse_unreadable(state, path)
    target = Path(path)
    if target.is_dir():
        raise CheckpointError(f"cannot save checkpoint {str(target)!r}: it is a folder; give a file's path, "
                              "e.g. run/last.pt")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        blocker = next((p for p in target.parents if p.exists() and not p.is_dir()), target.parent)
        raise CheckpointError(f"cannot save checkpoint {str(target)!r}: {str(blocker)!r} is a file, not a "
                              "folder; give a path in a folder") from None

    def write(handle: Any) -> None:
        torch.save(state, handle)
        handle.flush()
        os.fsync(handle.fileno())

    try:
        write_atomically(target, write)
    except Exception as exc:
        full = disk_full_cause(exc)
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
