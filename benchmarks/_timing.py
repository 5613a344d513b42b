"""Side-by-side timing: variants run interleaved in one process, reported as ratios to a baseline."""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Mapping


def interleaved(
    variants: dict[str, Callable[[], None]],
    *,
    rounds: int = 5,
    warmup: int = 1,
    after: Mapping[str, Callable[[], None]] | None = None,
) -> dict[str, float]:
    """Median seconds per call of each variant, timed by `interleaved_samples`."""
    samples = interleaved_samples(variants, rounds=rounds, warmup=warmup, after=after)
    return {name: statistics.median(times) for name, times in samples.items()}


def paired_ratio(samples: Mapping[str, list[float]], variant: str, baseline: str) -> float:
    """Median over rounds of ``variant``'s time / ``baseline``'s time in the same round (>1: slower).

    Pairing within a round cancels the drifts that hit both (another tenant, frequency), so the ratio is
    steadier than a ratio of medians.
    """
    return statistics.median(v / b for v, b in zip(samples[variant], samples[baseline], strict=True))


def interleaved_samples(
    variants: dict[str, Callable[[], None]],
    *,
    rounds: int = 5,
    warmup: int = 1,
    after: Mapping[str, Callable[[], None]] | None = None,
) -> dict[str, list[float]]:
    """Seconds of each call of each variant, round by round, the variants taking turns so noise hits all alike.

    The order of the variants is shuffled anew each round (seeded, so runs repeat), so that no variant always
    runs first, last, or right after the same other one.

    ``after[name]``, when given, runs untimed after every call of variant ``name`` (warm-up calls too): a
    data-loading variant uses it to run its epoch to the end, so its worker processes are idle, not
    stealing CPU, while the next variant is timed.
    """
    after = after or {}

    def call(name: str, fn: Callable[[], None]) -> float:
        start = time.perf_counter()
        fn()
        elapsed = time.perf_counter() - start
        if name in after:
            after[name]()
        return elapsed

    for name, fn in variants.items():
        for _ in range(warmup):
            call(name, fn)
    samples: dict[str, list[float]] = {name: [] for name in variants}
    order = list(variants)
    shuffle = random.Random(0).shuffle
    for _ in range(rounds):
        shuffle(order)
        for name in order:
            samples[name].append(call(name, variants[name]))
    return samples


def report(
    title: str,
    medians: dict[str, float],
    baseline: str,
    unit: str = "s",
    *,
    items: float | None = None,
    item_unit: str = "images",
) -> str:
    """A small table: each variant's median and its speed relative to ``baseline`` (>1 = faster).

    With ``items`` (what one timed call processes, e.g. the images of a batch when the medians are per
    batch) a rate column is added: ``items / median`` in ``item_unit``/s.
    """
    rate_header = f"{item_unit + '/s':>14}" if items is not None else ""
    lines = [title, f"{'variant':<40} {'median ' + unit:>12}{rate_header} {'speed vs ' + baseline:>24}"]
    base = medians[baseline]
    for name, value in medians.items():
        rate = f"{items / value:>14.1f}" if items is not None else ""
        lines.append(f"{name:<40} {value:>12.4f}{rate} {base / value:>23.2f}x")
    return "\n".join(lines)
