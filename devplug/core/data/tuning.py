"""Loader settings chosen from the device and the source, by measuring the source.

``Trainer.dataloader`` leaves ``num_workers``, ``pin_memory`` and ``prefetch_factor`` to devplug unless
the author sets them (``LoaderOptions.automatic`` names those left). A device plugin's loader hook calls
`tune_loader` (public as ``devplug.toolkit.tune_loader``) to choose the worker processes for the
options left automatic; what the author set is never changed, and nothing is measured for it.

How the choice is made — measured, not guessed:

1. **Measure the source.** One batch is read and collated in the main process, as
   ``DataLoader(num_workers=0)`` would (samples spread evenly over the data set, for at most
   `MEASURE_SECONDS`; a first sample read as a warm-up does not count, and a partial batch is
   extrapolated to a whole one; a data set with ``__getitems__``, such as a ``Subset`` from ``random_split``,
   is read through it, as the loader will: in calls of growing size, and the rest of the batch in one call
   once it fits in the time). Nothing the training relies on moves: no sampler is iterated, and torch's, Python's and
   NumPy's global random states are restored afterwards.
2. **A cheap source is read in the main process** (no workers) on every device: a batch that costs at
   most `CHEAP_BATCH_SECONDS` there costs about as much to receive from a worker process (measured
   on a 2-core x86 VM, torch 2.14, worker queue full: 1.8 ms for a 64×3×32×32 uint8 batch, 3.3–3.8 ms
   for 64×3×64×64 float32 or 256×3×64×64 uint8), so a worker cannot pay. A uint8 memory-mapped cache
   (0.4–0.9 ms per batch of 64 there) and tensors in memory are cheap.
3. **Where compute competes for the host's cores** (a CPU device), workers run in the step's time: on
   the VM above, torch's intra-op threads keep both cores busy through the DCGAN step (1.99 cores used),
   and a worker's time comes out of the step's (plus its hand-over). Workers pay only when a sample is
   expensive enough that reading it in parallel outweighs that: at least `CPU_WORKER_SAMPLE_SECONDS`
   per sample. Measured with ``benchmarks/dcgan_throughput.py`` there (``--workers auto,0,1,2``, one run
   each): the embedded shapes drawn image by image (0.34 ms per sample) trained faster with no worker
   (FULL 0.90 of SYNTHETIC, vs 0.85 with one worker, and 0.86 with two at SCHED_IDLE priority, tried and
   not kept); decoding 480×360 JPEGs (1.6 ms per sample) trained faster with a worker per core (1.15× no
   worker, 1.19× one worker). So an expensive source gets one worker per usable core (at most `MAX_WORKERS`): when
   the step waits for data, all cores decode.
4. **Where compute runs on an accelerator**, any source that is not cheap gets CPU cores − 1 workers, at
   most `MAX_WORKERS` (the usual data-loading rule: the host's cores are otherwise idle, and one is
   left to the main thread, which must keep launching the device's work).

A source that cannot be read ahead (no length, a sample that raises) is not measured and keeps the
Trainer's defaults; the reason says so. An ``IterableDataset`` is read in the main process (no workers):
torch copies it into every worker process, and each copy yields the whole stream unless the data set
splits itself with ``torch.utils.data.get_worker_info()``, so workers the author did not ask for would
repeat every sample; an author whose data set splits itself passes ``num_workers``.
"""

from __future__ import annotations

import contextlib
import os
import random
import sys
import time
from collections.abc import Iterator
from typing import Any

import attrs
import torch
from torch.utils.data import IterableDataset
from torch.utils.data._utils.collate import default_collate

from devplug.core.contract.records import LoaderOptions

#: A batch that costs at most this many seconds in the main process is read there (no worker processes).
CHEAP_BATCH_SECONDS = 0.005
#: On a device whose compute shares the host's cores, workers only where a sample costs at least this.
CPU_WORKER_SAMPLE_SECONDS = 0.001
#: The most time spent reading samples to measure a source (at least one sample is always read).
MEASURE_SECONDS = 0.2
#: Worker processes devplug starts at most.
MAX_WORKERS = 8
#: ``prefetch_factor`` when the author leaves it out (torch's default: batches each worker loads ahead).
DEFAULT_PREFETCH = 2


def available_cpus() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def default_workers() -> int:
    """The Trainer's worker count before measuring: the cores left after the main process, at most 8."""
    return min(MAX_WORKERS, max(0, available_cpus() - 1))


@contextlib.contextmanager
def _global_rng_untouched() -> Iterator[None]:
    """Restore torch's (CPU), Python's and NumPy's global random states afterwards (transforms may draw)."""
    python_state = random.getstate()
    numpy = sys.modules.get("numpy")
    numpy_state = numpy.random.get_state() if numpy is not None else None
    with torch.random.fork_rng(devices=[]):
        try:
            yield
        finally:
            random.setstate(python_state)
            if numpy is not None:
                numpy.random.set_state(numpy_state)


def main_process_batch_seconds(
    dataset: Any, options: LoaderOptions, *, budget: float = MEASURE_SECONDS
) -> tuple[float | None, str]:
    """Seconds one batch of ``dataset`` costs in the main process (fetch and collate), or ``None`` and why not.

    Reads at most one batch, for at most about ``budget`` seconds, at indices spread evenly over the
    data set (no sampler is iterated); global random states are restored afterwards.
    """
    if isinstance(dataset, IterableDataset):
        return None, "an IterableDataset is not read ahead of training"
    try:
        size = len(dataset)
    except TypeError:
        return None, "the data set has no length"
    if size == 0:
        return None, "the data set is empty"
    count = min(options.batch_size, size)
    indices = [i * size // count for i in range(count)]
    collate = options.collate_fn or default_collate
    with _global_rng_untouched():
        try:
            if hasattr(dataset, "__getitems__"):  # what DataLoader calls for a whole batch when it exists
                dataset.__getitems__(indices[:1])  # warm-up
                samples, per_sample = _read_in_chunks(dataset, indices, budget)
            else:
                samples, times = [], []
                start = time.perf_counter()
                for index in indices:
                    before = time.perf_counter()
                    samples.append(dataset[index])
                    times.append(time.perf_counter() - before)
                    if time.perf_counter() - start >= budget:
                        break
                warm = times[1:] or times  # the first read may open files or warm caches
                per_sample = sum(warm) / len(warm)
            before = time.perf_counter()
            collate(samples)
            collate_seconds = time.perf_counter() - before
        except Exception as exc:  # the loader would raise the same while training, where it is reported
            return None, f"reading its first samples raised {type(exc).__name__}"
    return per_sample * count + collate_seconds * count / max(1, len(samples)), ""


def _read_in_chunks(dataset: Any, indices: list[int], budget: float) -> tuple[list[Any], float]:
    """Samples read with ``__getitems__`` in calls of growing size, within about ``budget`` seconds; s/sample.

    Once what is left is expected to fit in the budget it is read in one call, as the loader reads a batch
    (a whole batch for a cheap source); the cost per sample is the largest call's.
    """
    samples: list[Any] = []
    size, done, per_sample = 1, 0, 0.0
    start = time.perf_counter()
    while done < len(indices):
        chunk = indices[done:done + size]
        before = time.perf_counter()
        samples += list(dataset.__getitems__(chunk))
        now = time.perf_counter()
        per_sample, done = (now - before) / len(chunk), done + len(chunk)
        left = len(indices) - done
        if now - start + per_sample * left <= budget:
            size = left  # the rest fits: read it at once
        elif now - start + per_sample * 2 * size > budget:
            break
        else:
            size *= 2
    return samples, per_sample


def tune_loader(dataset: Any, options: LoaderOptions, *, compute_competes: bool) -> tuple[LoaderOptions, str]:
    """``options`` with the worker processes chosen by measuring ``dataset``, and a sentence saying why.

    Only what ``options.automatic`` names is chosen: with ``num_workers`` set by the author the options
    come back unchanged, nothing is read, and the reason is ``""``. ``compute_competes``: the training
    step runs on the host's cores (a CPU device), so loader workers take their time from it; ``False``
    where it runs on an accelerator. ``pin_memory`` stays the device plugin's to set (where it is
    ``None``), and an automatic ``prefetch_factor`` keeps torch's 2. ``dataset`` is a
    ``torch.utils.data.Dataset`` (for an ``ImageFolderSource``, the ``ImageFolderDataset`` that will be
    loaded). The module docstring gives the measurements behind the thresholds.
    """
    if "num_workers" not in options.automatic:
        return options, ""
    if isinstance(dataset, IterableDataset):  # torch gives every worker a copy, and each yields all of it
        return (attrs.evolve(options, num_workers=0),
                "auto: 0 workers, an IterableDataset is read in the main process: torch copies it into every "
                "worker, and each would yield all of it unless it splits itself with get_worker_info(); pass "
                "num_workers for one that does")
    seconds, why_not = main_process_batch_seconds(dataset, options)
    if seconds is None:
        return options, f"auto: {options.num_workers} workers (the default; the source was not measured: {why_not})"
    per_sample = seconds / min(options.batch_size, len(dataset))
    cost = f"a batch costs {_shown(seconds)} in the main process"
    if seconds <= CHEAP_BATCH_SECONDS:
        return (attrs.evolve(options, num_workers=0),
                f"auto: 0 workers, {cost} (receiving it from a worker would cost about as much)")
    if compute_competes and per_sample < CPU_WORKER_SAMPLE_SECONDS:
        return (attrs.evolve(options, num_workers=0),
                f"auto: 0 workers, {cost} ({_shown(per_sample)} per sample): on this device workers would take "
                "their time from compute and save less than they cost")
    if compute_competes:
        workers = min(MAX_WORKERS, available_cpus())
        return (attrs.evolve(options, num_workers=workers),
                f"auto: {workers} workers (one per core, at most {MAX_WORKERS}), {cost} ({_shown(per_sample)} per "
                "sample): expensive enough to read in parallel")
    workers = default_workers()
    return (attrs.evolve(options, num_workers=workers),
            f"auto: {workers} workers (CPU cores - 1, at most {MAX_WORKERS}), {cost}")


def _shown(seconds: float) -> str:
    return f"{seconds * 1000:.2g} ms" if seconds < 0.01 else f"{seconds * 1000:.0f} ms" if seconds < 10 else \
        f"{seconds:.0f} s"
