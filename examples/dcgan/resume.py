"""Resuming a run: which checkpoint, what the command line may change, and keeping ``--auto-resume`` on one line.

- ``--auto-resume`` tries the newest ``step_*.pt`` in the run folder first; a file that is damaged
  (unreadable, truncated, corrupt, non-finite) is skipped with a warning and the one before it is tried.
  A checkpoint that does not fit the model flags is an error, not a reason to go back further.
- Options given on the resume command line override the checkpoint's: ``--lr`` and ``--beta1`` are set on
  both optimizers after the load (the run says so); everything else (weights, optimizer moments, step,
  epoch, data position, RNG states, fixed sample noise) carries over.
- Resuming from an older checkpoint of a folder that holds newer ones moves the newer ones aside into
  ``checkpoints/abandoned-<time>/`` (never deleted), so pruning keeps the resumed line and a later
  ``--auto-resume`` does not jump back to the abandoned one.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from devplug import CheckpointError, CheckpointMismatchError, NonFiniteLossError, Trainer

from .checkpoints import CHECKPOINT_RE, checkpoints_newest_first

Say = Callable[..., None]


def damaged(exc: Exception) -> bool:
    """True when a load failed because the file is damaged (empty, truncated, not a checkpoint, a failed
    digest, non-finite values, ...), not because it belongs to another model."""
    return not isinstance(exc, CheckpointMismatchError)


def load_first_good(trainer: Trainer, candidates: Sequence[Path], *, fall_back: bool,
                    warn: Say) -> tuple[Path, dict[str, Any]]:
    """Load the first candidate that loads; with ``fall_back``, damaged ones are skipped with a warning."""
    skipped = []
    for path in candidates:
        try:
            return path, trainer.load(path)
        except (CheckpointError, NonFiniteLossError) as exc:
            if not (fall_back and damaged(exc)):
                raise
            warn(f"dcgan: warning: skipping damaged checkpoint {path.name}: {exc}; trying the one before it")
            skipped.append(path.name)
    raise CheckpointError(f"no usable checkpoint to resume from: {', '.join(skipped)} are damaged; "
                          "start a new run (drop --auto-resume) or restore a checkpoint from a backup")


def apply_overrides(optimizers: Sequence[torch.optim.Optimizer], explicit: set[str], values: dict[str, float],
                    say: Say) -> list[str]:
    """Set ``--lr``/``--beta1`` given on the command line on every optimizer; the overrides made, as text."""
    made = []
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            if "lr" in explicit and group.get("lr") != values["lr"]:
                made.append(f"--lr {values['lr']:g} (checkpoint: {group['lr']:g})")
                group["lr"] = values["lr"]
            if "beta1" in explicit and "betas" in group and group["betas"][0] != values["beta1"]:
                made.append(f"--beta1 {values['beta1']:g} (checkpoint: {group['betas'][0]:g})")
                group["betas"] = (values["beta1"], group["betas"][1])
    for text in dict.fromkeys(made):
        say(f"dcgan: {text} overrides the checkpoint")
    return made


def set_aside_newer(resumed: Path, say: Say, *, now: datetime.datetime | None = None) -> Path | None:
    """Move checkpoints newer than ``resumed`` in its folder into ``abandoned-<time>/``; the folder, if any."""
    match = CHECKPOINT_RE.match(resumed.name)
    if match is None:
        return None
    step = int(match[1])
    newer = [p for p in checkpoints_newest_first(resumed.parent) if int(CHECKPOINT_RE.match(p.name)[1]) > step]
    if not newer:
        return None
    aside = resumed.parent / f"abandoned-{(now or datetime.datetime.now()).strftime('%Y%m%d-%H%M%S')}"
    aside.mkdir(exist_ok=True)
    for path in newer:
        path.rename(aside / path.name)
    say(f"dcgan: resuming from an older checkpoint: moved {len(newer)} newer one(s) to {aside}")
    return aside
