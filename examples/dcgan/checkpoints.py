"""The run's checkpoint files: ``checkpoints/step_NNNNNNN.pt``, found newest first, written and pruned."""

from __future__ import annotations

import errno
import re
import sys
from pathlib import Path
from typing import Any

import devplug

CHECKPOINT_RE = re.compile(r"^step_(\d+)\.pt$")


def checkpoints_newest_first(folder: Path) -> list[Path]:
    """``step_*.pt`` files in ``folder``, newest step first."""
    if not folder.is_dir():
        return []
    found = sorted(((int(m[1]), p) for p in folder.iterdir() if (m := CHECKPOINT_RE.match(p.name))), reverse=True)
    return [path for _step, path in found]


def resolve_checkpoint(path: Path) -> Path:
    """``path`` itself, or for a run folder (or its ``checkpoints/``) the newest ``step_*.pt`` in it."""
    if path.is_dir():
        folder = path / "checkpoints" if (path / "checkpoints").is_dir() else path
        found = checkpoints_newest_first(folder)
        if not found:
            raise devplug.CheckpointError(f"no checkpoint (step_*.pt) in {str(folder)!r} to resume from")
        return found[0]
    if not path.exists():
        raise devplug.CheckpointError(f"checkpoint {str(path)!r} does not exist")
    return path


def save_checkpoint(trainer: devplug.Trainer, folder: Path, extra: dict[str, Any], *, keep: int,
                    nonfinite: str) -> str | None:
    """Write ``folder/step_NNNNNNN.pt`` (main process) and prune to the newest ``keep`` (0 keeps all).

    Returns the path written, or ``None`` when nothing was (another process, or non-finite weights with
    ``nonfinite`` other than ``"raise"``). A full disk is a `devplug.CheckpointError` that says the
    previous checkpoint is intact.
    """
    target = folder / f"step_{trainer.global_step:07d}.pt"
    try:
        path = trainer.save(target, **extra)
    except devplug.NonFiniteLossError as exc:
        if nonfinite == "raise":
            raise
        print(f"dcgan: warning: not saving {target.name}: {exc}", file=sys.stderr)
        return None
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        previous = next(iter(checkpoints_newest_first(folder)), None)
        kept = f"the previous checkpoint {previous} is intact" if previous else "no earlier checkpoint was touched"
        raise devplug.CheckpointError(f"the disk is full: could not write {target} ({exc.strerror}); {kept}; "
                                      "free some space or give --out on another disk") from exc
    if path is not None and keep > 0:
        found = sorted((int(m[1]), p) for p in folder.iterdir() if (m := CHECKPOINT_RE.match(p.name)))
        for _step, old in found[:-keep]:
            old.unlink(missing_ok=True)
    return path
