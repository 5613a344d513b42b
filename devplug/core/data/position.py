"""The loop's position: steps, epoch, batches drawn, the accumulation window; what a resume skips.

A **step** is one optimizer-step round: one training batch, or ``accumulate_grad_batches`` micro-batches
of gradient accumulation. `LoopPosition` is what a checkpoint saves and a resume restores;
training loaders (`devplug.core.data.device_loader`) advance it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import attrs
import torch

from devplug.core.errors import CheckpointPositionError
from devplug.core.tree import map_tensors


@attrs.frozen
class ResumePoint:
    """Where a training loader was in its epoch when a checkpoint was saved.

    ``drawn`` batches on each of ``world_size`` ranks (``samples`` in all, when the batch size is
    known); ``sharded``: the loader read a devplug ``DistributedSampler`` permutation, whose first
    ``samples`` entries are the same whatever the world size.
    """

    drawn: int
    samples: int | None
    world_size: int
    sharded: bool

    def skip(self, batch_size: int | None, world_size: int, sharded: bool, name: str) -> int:
        """Batches to skip on this rank to continue at the same sample, or a `CheckpointPositionError` why not
        (the checkpoint is intact but fits another world size or batch size: a resume must not go back past it
        as if it were damaged)."""
        if self.drawn == 0:
            return 0
        saved_batch = None if self.samples is None else self.samples // (self.drawn * self.world_size)
        if world_size == self.world_size and saved_batch in (None, batch_size):
            return self.drawn
        where = (f"the checkpoint was saved {self.drawn} batches into an epoch on {self.world_size} rank(s) "
                 f"({self.samples} samples)")
        if not (self.sharded and sharded and batch_size):
            raise CheckpointPositionError(
                f"cannot continue {name} at the same sample on {world_size} rank(s) with batch size {batch_size}: "
                f"{where}, and its loader does not read devplug's sharded order; resume with the same world "
                "size and batch size, or from a checkpoint saved at an epoch boundary")
        per_step = batch_size * world_size
        if self.samples is None or self.samples % per_step:
            raise CheckpointPositionError(
                f"cannot continue {name} at the same sample on {world_size} rank(s) with batch size {batch_size}: "
                f"{where}, not a whole number of batches of {per_step} samples; pick a world size and batch "
                "size whose product divides it, or resume from a checkpoint saved at an epoch boundary")
        return self.samples // per_step


@attrs.define
class LoopPosition:
    """Where the training loop is: steps so far, the epoch, primary batches drawn in it, the accumulation window.

    ``global_step`` is the step being computed (1 during the first step's batches); ``in_window`` the
    micro-batches of it drawn so far; ``epoch_batches`` the primary loader's batches per epoch when known.
    """

    global_step: int = 0
    epoch: int = 0
    batches_in_epoch: int = 0
    in_window: int = 0
    accumulation: int = 1
    max_steps: int | None = None
    epoch_batches: int | None = None
    resume_points: dict[int, ResumePoint] = attrs.field(factory=dict)
    resume_seeds: dict[int, int] = attrs.field(factory=dict)
    stop_check: Callable[[], bool] | None = None
    stopped: bool = False
    #: inside ``epochs()``, and inside the primary loader's pass over an epoch: a value logged inside
    #: ``epochs()`` but outside that pass (an evaluation after the epoch's batches) is written at once
    in_epochs: bool = False
    drawing: bool = False

    @property
    def sync_now(self) -> bool:
        """True when the current micro-batch completes a step: gradients are synchronised and applied now.

        Also True outside a training loader (a loop that draws no batch from one steps every time).
        """
        if self.in_window == 0 or self.in_window >= self.accumulation:
            return True
        return self.epoch_batches is not None and self.batches_in_epoch >= self.epoch_batches

    def window_closed(self) -> bool:
        """True between steps (no micro-batch of an unfinished step drawn)."""
        return self.in_window == 0 or self.accumulation == 1 or self.sync_now

    def steps_left(self) -> bool:
        """False once ``max_steps`` steps have completed."""
        return self.max_steps is None or self.global_step < self.max_steps or not self.window_closed()

    def advance(self, closes_epoch: bool = False) -> None:
        """Count one primary micro-batch (``closes_epoch``: it is the epoch's last, found by looking ahead)."""
        if self.accumulation == 1 or self.window_closed():  # without accumulation every batch is a step
            self.global_step += 1
            self.in_window = 0
        self.in_window += 1
        self.batches_in_epoch += 1
        if closes_epoch:
            self.epoch_batches = self.batches_in_epoch

    def finish_epoch(self) -> None:
        """Move to the next epoch (a resume point left unused belonged to the epoch that ended)."""
        self.epoch += 1
        self.resume_points.clear()
        self.batches_in_epoch = 0
        self.in_window = 0

    def steps_per_epoch(self, batches: float) -> float:
        """Steps in an epoch of ``batches`` primary batches."""
        return batches if batches is math.inf else math.ceil(batches / self.accumulation)


def batch_size(batch: Any) -> int:
    """Samples in a batch, from the first tensor's leading dimension (host metadata, no sync)."""
    if isinstance(batch, (tuple, list)) and batch:  # the common (inputs, targets): looked at first
        first = batch[0]
        if isinstance(first, torch.Tensor) and first.dim() > 0:
            return int(first.shape[0])
    elif isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() > 0 else 1
    found: list[int] = []

    def _first(t: torch.Tensor) -> torch.Tensor:
        if not found and t.dim() > 0:
            found.append(int(t.shape[0]))
        return t

    map_tensors(batch, _first)
    return found[0] if found else 1
