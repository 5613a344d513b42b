"""Loaders whose batches arrive on the device and advance the loop's position.

Training loaders advance the position (`devplug.core.data.position`); evaluation loaders
(``Trainer.dataloader(..., train=False)``) never do: they yield their whole dataset across the ranks, each
sample once (`devplug.core.data.evaluation`), and are never skipped on resume. The first training
loader a Trainer builds is its *primary* loader: its batches define steps, epochs, progress and
throughput; further training loaders are iterated alongside and only resume where they were.
`DeviceLoader` iterates a plugin's (or the author's) loader, moves batches to the device, and
advances the position.
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

import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, DistributedSampler, RandomSampler, SequentialSampler

from devplug.core.contract.records import ImageFolderSource, LoaderChoice, LoaderOptions
from devplug.core.data.position import LoopPosition, ResumePoint, batch_size
from devplug.core.data.torch_loader import ShardSampler
from devplug.core.data.tuning import DEFAULT_PREFETCH, default_workers
from devplug.core.errors import ConfigError, DataError

log = logging.getLogger("devplug")
_END = object()
AUTHORS = "author's"  # how the implementation of a loader the author built starts


def loader_options(*, num_workers: int | None, pin_memory: bool | None, prefetch_factor: int | None,
                   **values: Any) -> LoaderOptions:
    """The `LoaderOptions` for ``Trainer.dataloader``, or a `ConfigError` naming the bad option.

    ``None`` leaves an option to devplug and names it in ``LoaderOptions.automatic``; the fields still
    hold usable defaults for plugins that pass them on: ``num_workers`` the cores left after the main
    process (at most 8), ``prefetch_factor`` 2, ``pin_memory`` ``None`` (the device plugin decides). The
    device plugin's loader hook tunes what is automatic (`devplug.core.data.tuning.tune_loader`).
    """
    automatic = {name for name, value in (("num_workers", num_workers), ("pin_memory", pin_memory),
                                          ("prefetch_factor", prefetch_factor)) if value is None}
    for name, value in (("batch_size", values.get("batch_size")), ("prefetch_factor", prefetch_factor)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise ConfigError(f"invalid data loader option: {name} must be a positive integer, got {value!r}")
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
        sampler = source.sampler
        if type(source.batch_sampler) is BatchSampler:  # the sampler that orders: inside a batch_sampler= given,
            sampler = source.batch_sampler.sampler  # where source.sampler is a SequentialSampler torch put in
        return LoaderChoice(loader=source, implementation=f"{AUTHORS} DataLoader(workers={source.num_workers})",
                            sampler=sampler)
    return LoaderChoice(loader=source, implementation=f"{AUTHORS} iterable ({type(source).__name__})")


def reproducible_order(choice: LoaderChoice) -> str:
    """Why the loader's batch order can be replayed after a resume ('' when it can)."""
    loader, sampler = choice.loader, choice.sampler
    if isinstance(loader, DataLoader):
        batches = loader.batch_sampler
        if batches is not None and type(batches) is not BatchSampler:  # the author's own: it alone orders
            if hasattr(batches, "set_epoch"):
                return ""
            return f"its batch sampler {type(batches).__name__} has no set_epoch, so devplug cannot replay its order"
        if isinstance(loader.dataset, torch.utils.data.IterableDataset):  # no sampler: the dataset orders
            return (f"its dataset, an IterableDataset ({type(loader.dataset).__name__}), may yield other samples "
                    "when iterated again")
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
    drawn, once, so a resumed run sees the same data in the same order as an uninterrupted one: a torch
    loader devplug built starts its sampler past them (their samples are never read); other loaders
    draw them and throw them away.

    A primary loader of unknown length under gradient accumulation draws one batch ahead, to know whether
    the current micro-batch is the epoch's last. When the loop leaves the pass before that batch is handed
    out (``max_steps``, a ``break``, a stop signal), it is kept: an iterator source (a generator) hands it
    out first on its next pass, which goes on where this one stopped; a loader that starts a fresh pass
    draws it again (the position counts only the batches handed out, so a resume skips no more).
    """

    def __init__(self, choice: LoaderChoice, seed: int, position: LoopPosition, move: Callable[[Any], Any],
                 on_batch: Callable[[int, float], None], *, train: bool = True, index: int = 0,
                 world_size: int = 1, before_batch: Callable[[], None] | None = None,
                 after_batches: Callable[[], None] | None = None,
                 region: Callable[[str], contextlib.AbstractContextManager[Any] | None] | None = None,
                 on_data_lost: Callable[[BaseException], BaseException] | None = None) -> None:
        self.choice = choice
        self.world_size = world_size
        self.seed = position.resume_seeds.pop(index, seed) if train else seed
        self.position = position
        self.train = train
        self.index = index  # among the Trainer's training loaders; 0 is the primary
        self.authors = choice.implementation.startswith(AUTHORS)  # the author built it: devplug does not reseed it
        self.drawn = 0  # batches drawn in the current epoch (a loader beside the primary: in its current pass)
        self._epoch: int | None = None
        self._move = None if choice.on_device else move
        self._on_batch = on_batch
        self._before_batch = before_batch
        self._after_batches = after_batches
        self._used_up = False  # an iterator source that reached its end
        self.passing = False  # a pass is open: started and neither ended nor closed (the author may still hold it)
        self._held: Any = _END  # an iterator source's batch drawn ahead by a pass left early: its next pass's first
        self._region = region
        self._on_data_lost = on_data_lost

    @property
    def implementation(self) -> str:
        """Which loader was chosen, e.g. ``"torch DataLoader(workers=4, pin_memory=True)"``."""
        return self.choice.implementation

    @property
    def primary(self) -> bool:
        """True for the training loader whose batches define steps and epochs."""
        return self.train and self.index == 0

    def __len__(self) -> int:
        return len(self.choice.loader)  # type: ignore[arg-type]  # TypeError for a loader without one

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

    def _skip_by_index(self, skip: int) -> bool:
        """Start the sampler of a torch loader devplug built after ``skip`` batches (their samples unread); True if so.

        Set on every pass (0 when nothing is skipped), so no start is left over from a pass that read nothing.
        Other loaders (the author's, DALI, HabanaDataLoader, iterables) skip by drawing the batches.
        """
        loader, sampler = self.choice.loader, self.choice.sampler
        if (self.authors or type(loader) is not DataLoader or not isinstance(sampler, ShardSampler)
                or loader.sampler is not sampler or not loader.batch_size):
            return False
        sampler.start_next_at(skip * loader.batch_size)
        self.drawn += skip
        return True

    def __iter__(self) -> Iterator[Any]:
        # one generator, no delegation: the loop resumes it once per batch
        started: Any = None  # the loader's iterator for this pass, once made
        pending: Any = _END  # the primary loader's batch drawn ahead (looked at), not yet handed out
        try:
            self.passing = True
            position = self.position
            fresh = not isinstance(self.choice.loader, collections.abc.Iterator)  # iter() starts a fresh pass
            if self.train and (self._epoch != position.epoch or (fresh and not self.primary)):
                # a fresh pass of a loader iterated alongside the primary starts from its first batch again (one
                # shorter than the primary's epoch is iterated again when it runs out): a resume skips into it
                self._epoch, self.drawn = position.epoch, 0
            self._prepare_epoch(position.epoch)
            if self.primary:
                length = self.length()
                position.epoch_batches = None if length is math.inf else int(length)
            skip = self._skip()
            indexed = self._skip_by_index(skip)
            batches = started = iter(self.choice.loader)
            if batches is self.choice.loader:  # an iterator (a generator): it has one pass in it
                batches = self._one_pass(batches)
            for _ in range(0 if indexed else skip):
                if next(batches, _END) is _END:
                    return
                self.drawn += 1
            move = self._move
            if not self.primary:  # an evaluation loader, or a training one iterated alongside the primary one
                for batch in batches:
                    if self.train:
                        self.drawn += 1
                    yield move(batch) if move is not None else batch
                return
            # the primary loader: everything the loop reads per batch is looked up once here
            position.drawing = True
            lookahead = position.accumulation > 1 and position.epoch_batches is None
            pending = next(batches, _END) if lookahead else _END
            before_batch, region, on_batch, clock = self._before_batch, self._region, self._on_batch, time.perf_counter
            while position.steps_left():
                if before_batch is not None:
                    before_batch()  # a profiler window opens or closes here
                if self._stopping():  # before the clock: a check across ranks waits for the slowest, not the loader
                    return
                asked = clock()  # the loop waits for the loader from here to the yield (no device sync)
                mark = region("data_wait") if region is not None else None
                if mark is None:
                    batch, pending = self._draw(batches, pending, lookahead)
                else:
                    with mark:
                        batch, pending = self._draw(batches, pending, lookahead)
                if batch is _END:
                    return
                on_batch(batch_size(batch), clock() - asked)
                yield batch
        finally:  # the epoch ended, or the loop left it (break, exception): end what a step boundary would
            self.passing = False
            if pending is not _END and started is self.choice.loader:
                self._held = pending  # drawn from the author's iterator and never trained on: the next pass's first
            if started is not None and started is not getattr(self.choice.loader, "_iterator", None):
                stop_workers(started)  # this pass's own workers (not persistent ones): now, not at GC
            if self.primary:
                self.position.drawing = False
                if self._after_batches is not None:
                    self._after_batches()

    def stop_workers(self) -> None:
        """Shut down the worker processes a torch DataLoader keeps between passes (``persistent_workers``).

        The Trainer calls it when its epochs end and on ``close()``; iterating the loader again starts new
        workers. Loaders other than torch's are left alone.
        """
        loader = self.choice.loader
        if isinstance(loader, DataLoader) and getattr(loader, "_iterator", None) is not None:
            iterator, loader._iterator = loader._iterator, None
            stop_workers(iterator)

    def _one_pass(self, batches: Iterator[Any]) -> Iterator[Any]:
        if self._used_up:
            kind = "training" if self.train else "evaluation"
            raise DataError(f"the {kind} loader's source, a {type(self.choice.loader).__name__}, was used up by "
                            "its first pass, so this pass would have no batches; give a list of batches, a "
                            "DataLoader, or an object whose __iter__ starts a fresh pass")
        held, self._held = self._held, _END
        if held is not _END:  # drawn ahead by the pass before, which was left early
            yield held
        # not `yield from`: closing this pass (the loop left it early) would close the author's generator too,
        # and a later pass would find it empty instead of going on where this one stopped
        for batch in batches:  # noqa: UP028
            yield batch
        self._used_up = True

    def _stopping(self) -> bool:
        """True when a stop signal ends the epoch here, between steps, before the next one (``position.stopped``)."""
        position = self.position
        if position.stop_check is not None and (position.accumulation == 1 or position.window_closed()) \
                and position.stop_check():
            position.stopped = True
            return True
        return False

    def _draw(self, batches: Iterator[Any], pending: Any, lookahead: bool) -> tuple[Any, Any]:
        """The primary loader's next batch, moved, and the one looked ahead at; ``_END`` at the end."""
        position = self.position
        try:
            batch = pending if lookahead else next(batches, _END)
            if batch is not _END and lookahead:
                pending = next(batches, _END)
        except (DataError, OSError) as exc:  # the data went away mid-run (also in a loader worker)
            if self._on_data_lost is None:
                raise
            raise self._on_data_lost(exc) from exc
        if batch is _END:
            return _END, pending
        self.drawn += 1
        position.advance(closes_epoch=lookahead and pending is _END)
        return (self._move(batch) if self._move is not None else batch), pending


def stop_workers(iterator: Any) -> None:
    """Shut down the worker processes of a torch DataLoader iterator now, and wait until they are gone.

    torch's own clean-up runs when the iterator is garbage collected; when a Trainer holding it is collected
    as part of a reference cycle, its queues are finalized first and the workers never hear that they should
    stop, so each costs torch's join timeout (5 s) before it is terminated. Anything else is left alone.
    """
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if shutdown is None:  # a single-process iterator, another loader's, or none
        return
    shutdown()
    for process in getattr(iterator, "_workers", ()):  # a worker torch terminated may still be exiting
        process.join(timeout=10)


def data_lost_reason(exc: BaseException) -> str:
    """Why reading the data failed, in one line: the original error of a loader worker, not torch's wrapping.

    torch re-raises a worker's exception as the same type with "Caught ... in DataLoader worker process N"
    and the worker's whole traceback as its message; the reason is the traceback's last line.
    """
    text = str(exc)
    if "in DataLoader worker process" in text and "Traceback" in text:
        last = text.rstrip().splitlines()[-1]
        _name, sep, rest = last.partition(": ")
        text = rest if sep else last
    return " ".join(text.split()) or type(exc).__name__
