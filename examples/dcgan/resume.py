"""Resuming a run, the example's part of it: what it prints and what the command line may change.

The Trainer's checkpoint policy does the file work (``trainer.resume``): ``--auto-resume`` takes the
newest intact checkpoint of ``--out``, skipping damaged ones; ``--resume PATH`` a checkpoint file or a run
folder's newest; resuming from an older one moves the newer ones aside into ``checkpoints/abandoned-<time>/``.
This module turns the `devplug.Resumed` record into the example's lines, and applies ``--lr`` and
``--beta1`` given on the resume command line to both optimizers after the load (the run says so); everything
else (weights, optimizer moments, step, epoch, data position, RNG states, fixed sample noise) carries over.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import torch

import devplug

from .notices import library_warnings_off

Say = Callable[..., None]

#: Model flags a checkpoint must have been written with.
MODEL_FLAGS = "--model/--nz/--ngf/--ndf/--image-size"


def resume(trainer: devplug.Trainer, source: Path | None, *, say: Say, warn: Say) -> devplug.Resumed | None:
    """Resume from ``source`` (``None``: the newest intact checkpoint of the run's own folder) and say how.

    Returns the record, or ``None`` for a new run. A checkpoint of another model size is one error line
    saying which flags to give.
    """
    try:
        with library_warnings_off():
            resumed = trainer.resume(source)
    except devplug.CheckpointMismatchError as exc:
        raise devplug.CheckpointError(f"{exc} (resume with the same {MODEL_FLAGS} as the run that wrote it)") from exc
    if resumed is None:
        return None
    for path, reason in resumed.skipped:
        warn(f"dcgan: warning: skipping damaged checkpoint {path.name}: {reason}; trying the one before it")
    say(f"resumed from {resumed.path} at step {resumed.step} (epoch {resumed.epoch})")
    return resumed


def report_set_aside(resumed: devplug.Resumed, say: Say) -> None:
    """Say where the checkpoints newer than the resumed one went, if any were moved."""
    if resumed.set_aside is not None:
        say(f"dcgan: resuming from an older checkpoint: moved {resumed.set_aside_count} newer one(s) to "
            f"{resumed.set_aside}")


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
