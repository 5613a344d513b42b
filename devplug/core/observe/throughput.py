"""`ThroughputMeter`: a training run's steady-state rate (samples, images or tokens per second), with pauses.

The Trainer logs samples/s between log points by itself (``trainer.throughput``); a run's summary wants
one figure for the whole run that leaves out what is not training: the first step (warm-up, compilation,
loader start-up) and every evaluation. This meter counts what the loop tells it and times the rest.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator


class ThroughputMeter:
    """Units per second of a training run, after its first step and without its pauses.

    The loop calls `add` once per step (or micro-batch) with the units it processed (across every rank),
    `first_step_done` once the first step has finished (the steady-state clock starts there), `pause` and
    `resume` around an evaluation (or ``with meter.paused():``), and `stop` at the end. The caller
    synchronises the device before `first_step_done`, `pause`, `resume` and `stop`, so queued device
    work falls inside the time it belongs to. ``clock`` is the seconds clock (``time.perf_counter``).
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        #: When the meter was made, the end of `stop` (``None`` while running), the start of the steady state.
        self.started: float = clock()
        self.stopped: float | None = None
        self.steady_start: float | None = None
        #: Wall-clock (Unix) time at the end of the first step, comparable across processes (a launcher that
        #: noted when it started a process gets the process's time to its first step from it).
        self.first_step_unix_time: float | None = None
        #: Units counted in the whole run, and after the first step.
        self.total = 0
        self.steady = 0
        #: Seconds of the steady state spent paused (evaluating).
        self.paused_seconds = 0.0
        self._pause_start: float | None = None

    def add(self, units: int) -> None:
        """Count the units of one completed step or micro-batch (every rank's)."""
        self.total += units
        if self.steady_start is not None:
            self.steady += units

    def first_step_done(self) -> None:
        """Start the steady-state clock (the first call only)."""
        if self.steady_start is None:
            self.steady_start = self._clock()
            self.first_step_unix_time = time.time()

    @property
    def is_steady(self) -> bool:
        """True once `first_step_done` was called."""
        return self.steady_start is not None

    def pause(self) -> None:
        """Stop counting time (an evaluation begins); a second pause before `resume` changes nothing."""
        if self._pause_start is None:
            self._pause_start = self._clock()

    def resume(self) -> None:
        """Count time again (the evaluation ended); the paused time inside the steady state is left out."""
        if self._pause_start is not None and self.steady_start is not None:
            self.paused_seconds += max(self._clock() - max(self._pause_start, self.steady_start), 0.0)
        self._pause_start = None

    def exclude(self, seconds: float) -> None:
        """Leave ``seconds`` of the steady state out of the rate (time measured elsewhere, e.g. the Trainer's
        `checkpoint_seconds`); before the first step it changes nothing."""
        if self.steady_start is not None:
            self.paused_seconds += max(seconds, 0.0)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """``with meter.paused():`` — `pause` on entry, `resume` on exit (an exception included); inside a pause
        already open it changes nothing (the outer one ends it)."""
        if self._pause_start is not None:
            yield
            return
        self.pause()
        try:
            yield
        finally:
            self.resume()

    def stop(self) -> None:
        """Stop the clocks (a pause still open ends here)."""
        self.resume()
        self.stopped = self._clock()

    @property
    def wall_seconds(self) -> float:
        """Seconds from the start to `stop` (or now), first step and pauses included."""
        return (self.stopped if self.stopped is not None else self._clock()) - self.started

    @property
    def per_second(self) -> float:
        """Steady-state units per second, pauses left out; the whole run's rate when it had one step only; 0
        when nothing ran."""
        end = self.stopped if self.stopped is not None else self._clock()
        if self.steady_start is not None and self.steady:
            seconds = end - self.steady_start - self.paused_seconds
            if seconds > 0:
                return self.steady / seconds
        wall = self.wall_seconds
        return self.total / wall if wall > 0 else 0.0
