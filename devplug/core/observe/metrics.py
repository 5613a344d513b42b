"""Logged values kept on the device between log points, and throughput measured honestly.

``log()`` only appends detached device tensors: no host-device synchronisation. At a log point the
pending values are averaged on the device, (optionally) reduced across ranks, and copied to the host
in a single transfer.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import Tensor

#: The figures devplug measures itself and adds to a log point (as opposed to the values the author logs).
MEASURED_NAMES = frozenset({"samples_per_sec", "data_wait", "mfu", "flops_per_sample", "samples_per_dollar",
                            "peak_flops"})


class MetricBuffer:
    """Scalars accumulated on the device between log points.

    `add_all` is on every step's path: it keeps a tensor as it is (detached only when it carries a
    graph, no reshape or copy: those wait for the log point) and a number as a float, and appends to the
    name's list. No device work is queued and nothing is read back.
    """

    __slots__ = ("_values",)

    def __init__(self) -> None:
        self._values: dict[str, list[torch.Tensor | float]] = {}

    def add(self, name: str, value: Any) -> None:
        """Remember one value (a tensor stays where it is; numbers are kept as floats)."""
        self.add_all({name: value})

    def add_all(self, scalars: dict[str, Any]) -> None:
        """Remember each ``name=value`` of ``scalars`` (tensors stay where they are; numbers become floats)."""
        values = self._values
        for name, value in scalars.items():
            if isinstance(value, Tensor):
                if value.numel() != 1:
                    raise ValueError(f"logged value {name!r} must be a scalar, got shape {tuple(value.shape)}")
                if value.requires_grad:
                    value = value.detach()  # the graph is not kept alive until the log point
            else:
                value = logged_number(name, value)
            pending = values.get(name)
            if pending is None:
                values[name] = [value]
            else:
                pending.append(value)

    def __bool__(self) -> bool:
        return bool(self._values)

    def flush(self, reduce: Callable[[torch.Tensor], torch.Tensor] | None = None) -> dict[str, float]:
        """Mean of each name since the last flush, read back in one transfer; clears the buffer.

        The names come back in the order they were first logged (the progress bar shows the first ones); the
        transfer packs them by name, so that every rank reduces the same figures in the same order.
        """
        if not self._values:
            return {}
        logged = list(self._values)
        names = sorted(logged)
        means: list[torch.Tensor] = []
        device = next(
            (v.device for vs in self._values.values() for v in vs if isinstance(v, torch.Tensor)),
            torch.device("cpu"),
        )
        for name in names:
            means.append(_mean(self._values[name], device))
        packed = torch.stack(means)
        if reduce is not None:
            packed = reduce(packed)
        self._values.clear()
        means_by_name = dict(zip(names, packed.tolist(), strict=True))
        return {name: means_by_name[name] for name in logged}


def _mean(values: list[torch.Tensor | float], device: torch.device) -> torch.Tensor:
    """The float32 mean of one name's values on ``device``, in a few device operations.

    Values of one kind (all numbers, or tensors of one dtype on ``device``) are stacked at once and
    converted after (the same figures, element for element); a mix is converted value by value.
    """
    tensors = [v for v in values if isinstance(v, torch.Tensor)]
    if not tensors:
        return torch.tensor(values, dtype=torch.float32, device=device).mean()
    if len(tensors) == len(values) and {(t.dtype, t.device) for t in tensors} == {(tensors[0].dtype, device)}:
        return torch.stack([t if t.dim() == 0 else t.reshape(()) for t in tensors]).to(dtype=torch.float32).mean()
    tensors = [v.reshape(()) if isinstance(v, torch.Tensor) else torch.tensor(v) for v in values]
    return torch.stack([t.to(device=device, dtype=torch.float32) for t in tensors]).mean()


def logged_number(name: str, value: Any) -> float:
    """``value`` as a float; a ValueError naming ``name`` when it is not a number."""
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"logged value {name!r} must be a number or a one-element tensor, "
                         f"got {type(value).__name__} {value!r:.60}") from None


def nonfinite(values: dict[str, float]) -> list[str]:
    """Names whose value is NaN or infinite."""
    return [k for k, v in values.items() if not math.isfinite(v)]


class Throughput:
    """Samples per second and the share of wall time spent waiting for the loader, between log points and
    over the whole run (the caller synchronises the device before a lap).

    The data wait is host time from the loop asking a loader for a batch to the batch being ready on the
    device queue (``perf_counter`` only: no host-device synchronisation). The clock starts at the first
    batch, so the first batch's wait (worker start-up) is not counted; it stands still from the end of a loop
    (`idle`) to the next training batch, so time outside ``epochs()`` (between chunks of ``max_steps``) is not
    training either.
    """

    def __init__(self) -> None:
        self.samples_total = 0
        self.samples_since = 0
        self._start: float | None = None
        self._last: float | None = None
        self.seconds_total = 0.0
        self.wait_total = 0.0
        self.wait_since = 0.0
        self.wait_share = 0.0
        self._samples_timed = 0  # samples and data wait up to the end of ``seconds_total`` (the last lap or settle)
        self._wait_timed = 0.0
        self._paused_at: float | None = None  # when the outermost `paused` began (a lap inside it ends there)
        self._idle = False  # the loop ended (`idle`): ``_paused_at`` holds when, until the next batch
        #: Also entered by `paused` (the Trainer's FLOP count: an evaluation inside the counted step is left out).
        self.while_paused: Callable[[], AbstractContextManager[Any]] | None = None

    def start(self) -> None:
        """Start the clock (called at the first batch)."""
        if self._start is None:
            self._start = self._last = time.perf_counter()

    def add(self, samples: int, waited: float = 0.0) -> None:
        """Count samples of one batch and the seconds the loop waited for it (host-side bookkeeping only)."""
        if self._start is None:
            self.start()
        elif self._idle:  # the first batch of a loop entered again: the time since the last one ended is left out
            assert self._paused_at is not None
            self._idle, began, self._paused_at = False, self._paused_at, None
            self.exclude(time.perf_counter() - began)
        else:
            self.wait_total += waited
            self.wait_since += waited
        self.samples_total += samples
        self.samples_since += samples

    def exclude(self, seconds: float) -> None:
        """Take ``seconds`` of bookkeeping (a measured peak) out of the clock: rates ignore them. Inside `paused`
        nothing more is taken out: the pause leaves out its whole time, these seconds included."""
        if self._start is not None and self._last is not None and self._paused_at is None:
            self._start += seconds
            self._last += seconds

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """``with trainer.throughput.paused():`` around an evaluation: its time is left out of samples/s and of
        the data-wait share, and its FLOPs out of the step MFU counts (the caller synchronises the device
        before and after)."""
        began = time.perf_counter()
        outermost = self._paused_at is None
        if outermost:
            self._paused_at = began  # a log point inside (a lap) counts the time up to here, not the evaluation's
        try:
            with self.while_paused() if self.while_paused is not None else contextlib.nullcontext():
                yield
        finally:
            if outermost:
                self._paused_at = None
                self.exclude(time.perf_counter() - began)

    def lap(self) -> float:
        """Samples/s since the previous lap (``wait_share`` is then this lap's data wait); the caller synchronises."""
        now = time.perf_counter() if self._paused_at is None else self._paused_at
        assert self._last is not None and self._start is not None
        elapsed = max(now - self._last, 1e-9)
        rate = self.samples_since / elapsed
        self.wait_share = min(self.wait_since / elapsed, 1.0)
        self.seconds_total = now - self._start
        self._last, self.samples_since, self.wait_since = now, 0, 0.0
        self._samples_timed, self._wait_timed = self.samples_total, self.wait_total
        return rate

    def settle(self) -> None:
        """Bring the run's totals up to now without ending the lap: the loop ended, and the mean rate covers its
        last steps too, logged or not (the caller synchronises)."""
        if self._start is not None:
            now = time.perf_counter() if self._paused_at is None else self._paused_at
            self.seconds_total = now - self._start
            self._samples_timed, self._wait_timed = self.samples_total, self.wait_total

    def idle(self) -> None:
        """The loop ended: the clock stands still until the next training batch (`add`)."""
        if self._start is not None and self._paused_at is None:
            self._paused_at, self._idle = time.perf_counter(), True

    @property
    def mean_rate(self) -> float:
        """Samples/s over the run to the last lap, or to the end of the loop (0 before either)."""
        return self._samples_timed / self.seconds_total if self.seconds_total > 0 else 0.0

    @property
    def mean_wait_share(self) -> float:
        """Share of the run's wall time (to the last lap, or the end of the loop) spent waiting for the loader."""
        return min(self._wait_timed / self.seconds_total, 1.0) if self.seconds_total > 0 else 0.0
