"""Side-by-side timing: variants run interleaved in one process, reported as ratios to a baseline."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def interleaved(variants: dict[str, Callable[[], None]], *, rounds: int = 5, warmup: int = 1) -> dict[str, float]:
    """Median seconds per call of each variant, the variants taking turns so machine noise hits all alike."""
    for fn in variants.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, fn in variants.items():
            start = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - start)
    return {name: statistics.median(times) for name, times in samples.items()}


def report(title: str, medians: dict[str, float], baseline: str, unit: str = "s") -> str:
    """A small table: each variant's median and its speed relative to ``baseline`` (>1 = faster)."""
    lines = [title, f"{'variant':<40} {'median ' + unit:>12} {'speed vs ' + baseline:>24}"]
    base = medians[baseline]
    for name, value in medians.items():
        lines.append(f"{name:<40} {value:>12.4f} {base / value:>23.2f}x")
    return "\n".join(lines)
