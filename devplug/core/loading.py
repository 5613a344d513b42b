"""The loop's position (step, epoch, batches into the epoch) and loaders that advance it.

:class:`LoopPosition` is what a checkpoint saves and a resume restores; :class:`DeviceLoader` iterates a
plugin's loader, moves batches to the device, and advances the position, so the Trainer and its
loaders share one object instead of reaching into each other.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import attrs
import torch

from devplug.core.errors import ConfigError
from devplug.core.records import LoaderChoice, LoaderOptions
from devplug.core.tree import map_tensors

_END = object()


@attrs.define
class LoopPosition:
    """Where the training loop is: steps so far, the epoch, batches drawn in it, and what a resume skips."""

    global_step: int = 0
    epoch: int = 0
    batches_in_epoch: int = 0
    resume_skip: int = 0
    max_steps: int | None = None

    def take_resume_skip(self) -> int:
        """Batches the first pass after a mid-epoch resume must skip (once: later passes skip nothing)."""
        skip, self.resume_skip = self.resume_skip, 0
        return skip

    def steps_left(self) -> bool:
        """False once ``max_steps`` iterations have run."""
        return self.max_steps is None or self.global_step < self.max_steps

    def advance(self) -> None:
        """Count one iteration."""
        self.global_step += 1
        self.batches_in_epoch += 1

    def finish_epoch(self) -> None:
        """Move to the next epoch."""
        self.epoch += 1
        self.batches_in_epoch = 0


def loader_options(*, num_workers: int | None, **values: Any) -> LoaderOptions:
    """The :class:`LoaderOptions` for ``Trainer.dataloader``, or a :class:`ConfigError` naming the bad option.

    ``num_workers=None`` means the cores left after the main process (at most 8).
    """
    if num_workers is None:
        num_workers = min(8, max(0, (os.cpu_count() or 1) - 1))
    try:
        return LoaderOptions(num_workers=num_workers, **values)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"invalid data loader option: {exc}") from exc


def batch_size(batch: Any) -> int:
    """Samples in a batch, from the first tensor's leading dimension (host metadata, no sync)."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() > 0 else 1
    found: list[int] = []

    def _first(t: torch.Tensor) -> torch.Tensor:
        if not found and t.dim() > 0:
            found.append(int(t.shape[0]))
        return t

    map_tensors(batch, _first)
    return found[0] if found else 1


class DeviceLoader:
    """Iterates a plugin's loader: batches arrive on the device, steps and samples are counted.

    Each epoch reshuffles deterministically (sampler ``set_epoch`` or a reseeded generator), and after
    a resume the batches the interrupted epoch had already consumed are skipped, so a resumed run sees
    the same data in the same order as an uninterrupted one.
    """

    def __init__(self, choice: LoaderChoice, seed: int, position: LoopPosition,
                 move: Callable[[Any], Any], on_batch: Callable[[int], None]) -> None:
        self.choice = choice
        self.seed = seed
        self.position = position
        self._move = None if choice.on_device else move
        self._on_batch = on_batch

    @property
    def implementation(self) -> str:
        """Which loader the device plugin chose, e.g. ``"torch DataLoader(workers=4, pin_memory=True)"``."""
        return self.choice.implementation

    def __len__(self) -> int:
        return len(self.choice.loader)  # type: ignore[arg-type]

    def _prepare_epoch(self, epoch: int) -> None:
        sampler = self.choice.sampler
        if sampler is not None and hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)
        generator = getattr(self.choice.loader, "generator", None)
        if isinstance(generator, torch.Generator):
            generator.manual_seed(self.seed + epoch)

    def __iter__(self) -> Iterator[Any]:
        position, move = self.position, self._move
        self._prepare_epoch(position.epoch)
        batches = iter(self.choice.loader)
        for _ in range(position.take_resume_skip()):  # first pass after a mid-epoch resume
            if next(batches, _END) is _END:
                return
        while position.steps_left():
            batch = next(batches, _END)
            if batch is _END:
                return
            if move is not None:
                batch = move(batch)
            position.advance()
            self._on_batch(batch_size(batch))
            yield batch
