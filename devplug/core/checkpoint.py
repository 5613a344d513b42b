"""Atomic, device-portable checkpoints.

A checkpoint is written to a temporary file beside the target, flushed and fsynced, then renamed over
the target, so a crash mid-save leaves the previous checkpoint intact. Every tensor is moved to the
CPU first, so a checkpoint made on one device loads on another.
"""

from __future__ import annotations

import os
import pickle
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import torch

from devplug.core.errors import CheckpointError
from devplug.core.tree import map_tensors

FORMAT_VERSION = 1


def to_cpu(state: Any) -> Any:
    """A copy of ``state`` with every tensor detached and moved to the CPU."""
    return map_tensors(state, lambda t: t.detach().cpu())


def atomic_save(state: Any, path: str | os.PathLike[str]) -> Path:
    """Write ``state`` with ``torch.save`` to ``path`` atomically (temp file, fsync, rename)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            torch.save(state, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, target)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
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


def read_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Load a devplug checkpoint onto the CPU, or raise :class:`CheckpointError` saying what is wrong."""
    source = Path(path)
    if not source.is_file():
        raise CheckpointError(f"checkpoint {str(source)!r} does not exist")
    try:
        state = torch.load(source, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, pickle.UnpicklingError, zipfile.BadZipFile, OSError, ValueError) as exc:
        raise CheckpointError(f"checkpoint {str(source)!r} is corrupt or unreadable: {exc}") from exc
    if not isinstance(state, dict) or state.get("format") != FORMAT_VERSION or "modules" not in state:
        raise CheckpointError(
            f"{str(source)!r} is not a devplug checkpoint (format {FORMAT_VERSION}); "
            "was it written by Trainer.save()?"
        )
    return state
