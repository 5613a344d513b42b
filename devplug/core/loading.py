"""The loop's position (steps, epoch, batches drawn, accumulation window) and loaders that advance it.

A **step** is one optimizer-step round: one training batch, or ``accumulate_grad_batches`` micro-batches
of gradient accumulation. Training loaders advance the position; evaluation loaders
(``Trainer.dataloader(..., train=False)``) never do: they always yield their whole dataset and are never
skipped on resume. The first training loader a Trainer builds is its *primary* loader: its batches
define steps, epochs, progress and throughput; further training loaders are iterated alongside and
only resume where they were.

:class:`LoopPosition` is what a checkpoint saves and a resume restores; :class:`DeviceLoader` iterates a
plugin's (or the author's) loader, moves batches to the device, and advances the position.
"""

from __future__ import annotations

import collections.abc
import contextlib
import logging
import math
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import attrs
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, RandomSampler, SequentialSampler

from devplug.core.errors import CheckpointError, ConfigError, DataError
from devplug.core.loadtune import DEFAULT_PREFETCH, default_workers
from devplug.core.records import ImageFolderSource, LoaderChoice, LoaderOptions
from devplug.core.tree import map_tensors

log = logging.getLogger("devplug")
_END = object()
AUTHORS = "author's"  # how the implementation of a loader the author built starts


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
        """Batches to skip on this rank to continue at the same sample, or a :class:`CheckpointError` why not."""
        if self.drawn == 0:
            return 0
        saved_batch = None if self.samples is None else self.samples // (self.drawn * self.world_size)
        if world_size == self.world_size and saved_batch in (None, batch_size):
            return self.drawn
        where = (f"the checkpoint was saved {self.drawn} batches into an epoch on {self.world_size} rank(s) "
                 f"({self.samples} samples)")
        if not (self.sharded and sharded and batch_size):
            raise CheckpointError(
                f"cannot continue {name} at the same sample on {world_size} rank(s) with batch size {batch_size}: "
                f"{where}, and its loader does not read devplug's sharded order; resume with the same world "
                "size and batch size, or from a checkpoint saved at an epoch boundary")
        per_step = batch_size * world_size
        if self.samples is None or self.samples % per_step:
            raise CheckpointError(
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
        return self.in_window == 0 or self.sync_now

    def steps_left(self) -> bool:
        """False once ``max_steps`` steps have completed."""
        return self.max_steps is None or self.global_step < self.max_steps or not self.window_closed()

    def advance(self, closes_epoch: bool = False) -> None:
        """Count one primary micro-batch (``closes_epoch``: it is the epoch's last, found by looking ahead)."""
        if self.window_closed():
            self.global_step += 1
            self.in_window = 0
        self.in_window += 1
        self.batches_in_epoch += 1
        if closes_epoch:
            self.epoch_batches = self.batches_in_epoch

    def finish_epoch(self) -> None:
        """Move to the next epoch."""
        self.epoch += 1
        self.batches_in_epoch = 0
        self.in_window = 0

    def steps_per_epoch(self, batches: float) -> float:
        """Steps in an epoch of ``batches`` primary batches."""
        return batches if batches is math.inf else math.ceil(batches / self.accumulation)


def batch_size(batch: Any) -> int:
    """Samples in a batch, from the first tensor's leading dimension (host metadata, no sync)."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() > 0 else 1
    if isinstance(batch, (tuple, list)) and batch and isinstance(batch[0], torch.Tensor) and batch[0].dim() > 0:
        return int(batch[0].shape[0])
    found: list[int] = []

    def _first(t: torch.Tensor) -> torch.Tensor:
        if not found and t.dim() > 0:
            found.append(int(t.shape[0]))
        return t

    map_tensors(batch, _first)
    return found[0] if found else 1


def loader_options(*, num_workers: int | None, pin_memory: bool | None, prefetch_factor: int | None,
                   **values: Any) -> LoaderOptions:
    """The :class:`LoaderOptions` for ``Trainer.dataloader``, or a :class:`ConfigError` naming the bad option.

    ``None`` leaves an option to devplug and names it in ``LoaderOptions.automatic``; the fields still
    hold usable defaults for plugins that pass them on: ``num_workers`` the cores left after the main
    process (at most 8), ``prefetch_factor`` 2, ``pin_memory`` ``None`` (the device plugin decides). The
    device plugin's loader hook tunes what is automatic (:func:`devplug.core.loadtune.tune_loader`).
    """
    automatic = {name for name, value in (("num_workers", num_workers), ("pin_memory", pin_memory),
                                          ("prefetch_factor", prefetch_factor)) if value is None}
    try:
        return LoaderOptions(
            num_workers=default_workers() if num_workers is None else num_workers, pin_memory=pin_memory,
            prefetch_factor=DEFAULT_PREFETCH if prefetch_factor is None else prefetch_factor,
            automatic=frozenset(automatic), **values)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"invalid data loader option: {exc}") from exc


def is_dataset(source: Any) -> bool:
    """True for what a device plugin's loader hook takes: a Dataset, an ImageFolderSource, or a sequence of samples."""
    if isinstance(source, (Dataset, ImageFolderSource)):
        return True
    return isinstance(source, collections.abc.Sequence) and not isinstance(source, (str, bytes))


def own_loader_choice(source: Any, batch_size: int | None) -> LoaderChoice:
    """A LoaderChoice for a loader the author built: a ``DataLoader`` or any iterable of batches."""
    if isinstance(source, (str, bytes, os.PathLike)):
        raise DataError(f"got a path ({source!s}) as a data source; wrap it as devplug.ImageFolderSource(root, "
                          "image_size) or pass a Dataset")
    if not isinstance(source, collections.abc.Iterable):
        raise ConfigError(f"cannot load data from a {type(source).__name__}: pass a Dataset, an ImageFolderSource, "
                          "a torch DataLoader or an iterable of batches")
    if isinstance(source, DataLoader):
        if batch_size is not None and source.batch_size is not None and batch_size != source.batch_size:
            raise ConfigError(f"batch_size={batch_size} differs from your DataLoader's batch_size="
                              f"{source.batch_size}; leave batch_size out for a DataLoader you built")
        return LoaderChoice(loader=source, implementation=f"{AUTHORS} DataLoader(workers={source.num_workers})",
                            sampler=source.sampler)
    return LoaderChoice(loader=source, implementation=f"{AUTHORS} iterable ({type(source).__name__})")


def reproducible_order(choice: LoaderChoice) -> str:
    """Why the loader's batch order can be replayed after a resume ('' when it can)."""
    loader, sampler = choice.loader, choice.sampler
    if isinstance(loader, DataLoader):
        if isinstance(sampler, (DistributedSampler, SequentialSampler)) or hasattr(sampler, "set_epoch"):
            return ""
        if isinstance(sampler, RandomSampler):
            return ""  # devplug seeds it per epoch (see DeviceLoader._prepare_epoch)
        if loader.batch_sampler is not None and hasattr(loader.batch_sampler, "set_epoch"):
            return ""
        return f"its sampler {type(sampler).__name__} has no set_epoch, so devplug cannot replay its order"
    if isinstance(loader, collections.abc.Sequence):
        return ""
    if choice.implementation.startswith(AUTHORS):
        return f"a {type(loader).__name__} may yield other batches when iterated again"
    return ""


class DeviceLoader:
    """Iterates a loader: batches arrive on the device; a training loader advances the loop position.

    Each epoch reshuffles deterministically (sampler ``set_epoch``, or a generator seeded with
    ``seed + epoch``). After a resume, a training loader skips the batches the interrupted epoch had
    drawn, once, so a resumed run sees the same data in the same order as an uninterrupted one.
    """

    def __init__(self, choice: LoaderChoice, seed: int, position: LoopPosition, move: Callable[[Any], Any],
                 on_batch: Callable[[int, float], None], *, train: bool = True, index: int = 0,
                 world_size: int = 1, before_batch: Callable[[], None] | None = None,
                 after_batches: Callable[[], None] | None = None,
                 region: Callable[[str], contextlib.AbstractContextManager[Any]] | None = None) -> None:
        self.choice = choice
        self.world_size = world_size
        self.seed = position.resume_seeds.pop(index, seed) if train else seed
        self.position = position
        self.train = train
        self.index = index  # among the Trainer's training loaders; 0 is the primary
        self.authors = choice.implementation.startswith(AUTHORS)  # the author built it: devplug does not reseed it
        self.drawn = 0  # batches drawn in the current epoch
        self._epoch: int | None = None
        self._move = None if choice.on_device else move
        self._on_batch = on_batch
        self._before_batch = before_batch
        self._after_batches = after_batches
        self._region = region

    @property
    def implementation(self) -> str:
        """Which loader was chosen, e.g. ``"torch DataLoader(workers=4, pin_memory=True)"``."""
        return self.choice.implementation

    @property
    def primary(self) -> bool:
        """True for the training loader whose batches define steps and epochs."""
        return self.train and self.index == 0

    def __len__(self) -> int:
        return len(self.choice.loader)  # type: ignore[arg-type]

    def length(self) -> float:
        """Batches per epoch, or ``inf`` when the loader does not say."""
        try:
            return len(self)
        except TypeError:
            return math.inf

    def _prepare_epoch(self, epoch: int) -> None:
        loader, sampler = self.choice.loader, self.choice.sampler
        if isinstance(sampler, DistributedSampler) and not self.authors:
            sampler.seed = self.seed  # a resumed run continues the interrupted run's order, whatever its seed
        if sampler is not None and hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)
        elif isinstance(sampler, RandomSampler) and isinstance(loader, DataLoader):
            sampler.generator = torch.Generator().manual_seed(self.seed + epoch)  # replayable on resume
        batch_sampler = getattr(loader, "batch_sampler", None)
        if batch_sampler is not None and batch_sampler is not sampler and hasattr(batch_sampler, "set_epoch"):
            batch_sampler.set_epoch(epoch)
        generator = getattr(loader, "generator", None)
        if isinstance(generator, torch.Generator):
            generator.manual_seed(self.seed + epoch)

    @property
    def batch_size(self) -> int | None:
        """Samples per batch on this rank, when the loader says."""
        size = getattr(self.choice.loader, "batch_size", None)
        return size if isinstance(size, int) else None

    @property
    def sharded(self) -> bool:
        """True when the loader reads devplug's DistributedSampler order (resumable on another world size)."""
        return isinstance(self.choice.sampler, DistributedSampler)

    def resume_point(self, world_size: int) -> ResumePoint:
        """Where this (training) loader is in its epoch, for a checkpoint."""
        drawn = self.drawn if self._epoch == self.position.epoch else 0
        if self.primary:
            drawn = self.position.batches_in_epoch - (0 if self.position.window_closed() else self.position.in_window)
        size = self.batch_size
        return ResumePoint(drawn, None if size is None else drawn * size * world_size, world_size, self.sharded)

    def resume_skip(self, world_size: int) -> int:
        """Batches this loader will skip after a resume (validated; a CheckpointError when it cannot)."""
        point = self.position.resume_points.get(self.index) if self.train else None
        if point is None:
            return 0
        return point.skip(self.batch_size, world_size, self.sharded, f"training loader {self.index}")

    def _skip(self) -> int:
        skip = self.resume_skip(self.world_size) if self.train else 0
        if self.index in self.position.resume_points and self.primary:
            self.position.batches_in_epoch = skip  # in this run's batches (another world size: another count)
        self.position.resume_points.pop(self.index, None)
        if skip and (why := reproducible_order(self.choice)):
            log.warning("resuming mid-epoch: skipping %d batches of %s, but %s; the rest of this epoch may differ "
                        "from the interrupted run", skip, self.implementation, why)
        return skip

    def __iter__(self) -> Iterator[Any]:
        try:
            yield from self._batches()
        finally:  # the epoch ended, or the loop left it (break, exception): end what a step boundary would
            if self.primary and self._after_batches is not None:
                self._after_batches()

    def _batches(self) -> Iterator[Any]:
        position = self.position
        if self.train and self._epoch != position.epoch:
            self._epoch, self.drawn = position.epoch, 0
        self._prepare_epoch(position.epoch)
        if self.primary:
            length = self.length()
            position.epoch_batches = None if length is math.inf else int(length)
        batches = iter(self.choice.loader)
        for _ in range(self._skip()):
            if next(batches, _END) is _END:
                return
            self.drawn += 1
        if not self.train:
            yield from self._moved(batches)
            return
        lookahead = self.primary and position.accumulation > 1 and position.epoch_batches is None
        pending = next(batches, _END) if lookahead else _END
        while not self.primary or position.steps_left():
            if self.primary and self._before_batch is not None:
                self._before_batch()  # a profiler window opens or closes here
            asked = time.perf_counter()  # the loop waits for the loader from here to the yield (no device sync)
            with self._region("data_wait") if self.primary and self._region else contextlib.nullcontext():
                if self.primary and position.window_closed() and position.stop_check and position.stop_check():
                    position.stopped = True  # a stop signal: end before the next step begins
                    return
                batch = pending if lookahead else next(batches, _END)
                if batch is _END:
                    return
                if lookahead:
                    pending = next(batches, _END)
                self.drawn += 1
                if self.primary:
                    position.advance(closes_epoch=lookahead and pending is _END)
                batch = self._move(batch) if self._move is not None else batch
            if self.primary:
                self._on_batch(batch_size(batch), time.perf_counter() - asked)
            yield batch

    def _moved(self, batches: Iterator[Any]) -> Iterator[Any]:
        for batch in batches:
            yield self._move(batch) if self._move is not None else batch
