"""A profiler window: ``torch.profiler`` over a range of training steps, data wait included.

``Trainer(profile="steps 10-15")`` starts ``torch.profiler`` just before the loop asks the training loader
for step 10's batch and stops it once step 15 is done, with the activities the device plugin names
(``devplug_profiler_activities``). Inside the window every region the Trainer opens — ``data_wait``,
``forward``, ``backward``, ``optimizer_step`` — is also a ``record_function`` range, so the trace shows
where the time went, the loader included. The trace is a Chrome trace file,
``<log_dir>/profiler/rank<R>.<time>.pt.trace.json``, which TensorBoard's profiler plugin
(``tensorboard --logdir <log_dir>/profiler``) and Perfetto (ui.perfetto.dev) open. Outside the window
nothing is added to the step.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

log = logging.getLogger("devplug")

_WINDOW_RE = re.compile(r"^\s*(?:steps?\s+)?(\d+)\s*(?:-\s*(\d+))?\s*$")


def parse_window(text: Any) -> tuple[int, int]:
    """``"steps 10-15"``, ``"10-15"`` or ``"12"`` → ``(first, last)`` step, both included; ValueError otherwise."""
    match = _WINDOW_RE.match(text) if isinstance(text, str) else None
    if match is None:
        raise ValueError(f"profile must look like 'steps 10-15' (first and last step profiled), got {text!r}")
    first = int(match[1])
    last = int(match[2]) if match[2] is not None else first
    if first < 1 or last < first:
        raise ValueError(f"profile window {text!r} must name steps 1 <= first <= last")
    return first, last


def trace_dir(log_dir: str | None) -> str | None:
    """Where profiler traces go: ``<log_dir>/profiler``."""
    return os.path.join(log_dir, "profiler") if log_dir else None


class StepProfiler:
    """Runs ``torch.profiler`` over a window of steps; ``region`` adds a ``record_function`` range inside it.

    ``profile`` is the Trainer's window (``"steps 10-15"``, or ``None``: never profiles); traces go under
    ``log_dir/profiler``; ``activities`` asks the device plugin which activities to record (called when
    the window opens); ``steps_done`` gives the number of completed training steps; ``exclude`` takes the
    seconds spent ending the window and writing its trace out of the throughput clock.
    """

    def __init__(self, profile: str | None, log_dir: str | None, activities: Callable[[], list[Any] | None],
                 steps_done: Callable[[], int], rank: int = 0,
                 exclude: Callable[[float], None] = lambda _seconds: None) -> None:
        self.window = parse_window(profile) if profile is not None else None
        self.trace_dir = trace_dir(log_dir)
        self._activities = activities
        self._steps_done = steps_done
        self.rank = rank
        self._exclude = exclude
        self._profiler: Any = None
        self.traces: list[str] = []
        self._missed = False  # the window lay before the first step this process ran (said once)
        #: True while the profiler runs (an attribute: the step reads it several times per step).
        self.active = False

    def before_batch(self) -> None:
        """Called when the loop asks for the next training batch: open or close the window here."""
        if self.window is None:
            return
        upcoming = self._steps_done() + 1
        first, last = self.window
        if self._profiler is None and first <= upcoming <= last and not self.traces:
            self._start()
        elif self._profiler is not None and upcoming > last:
            self.stop()
        elif self._profiler is None and upcoming > last and not self.traces and not self._missed:
            self._missed = True  # a resumed run starts past the window: say so once, rather than write nothing
            log.warning("profile window steps %d-%d lies before step %d, where this run starts: no trace is written; "
                        "name later steps", first, last, upcoming)

    def region(self, name: str, inner: AbstractContextManager[Any]) -> AbstractContextManager[Any]:
        """``inner`` (the device plugin's mark), inside a ``record_function(name)`` range while profiling."""
        if self._profiler is None:
            return inner
        return _both(name, inner)

    def _start(self) -> None:
        import torch.profiler

        activities = self._activities() or [torch.profiler.ProfilerActivity.CPU]
        self._profiler = torch.profiler.profile(activities=activities, record_shapes=False)
        self._profiler.__enter__()
        self.active = True
        # (ignored: mypy takes the window for optional, and a profiler starts only inside it)
        log.info("profiling steps %d-%d (%s)", *self.window, ", ".join(a.name for a in activities))  # type: ignore[misc]

    def stop(self) -> str | None:
        """Stop profiling (if it runs) and write the trace; its path, or ``None``. A trace that cannot be written
        (a full disk, a folder that takes no files) is one warning, and training goes on, as for the loggers."""
        if self._profiler is None:
            return None
        profiler, self._profiler, self.active = self._profiler, None, False
        began = time.perf_counter()
        try:
            profiler.__exit__(None, None, None)
            assert self.trace_dir is not None
            path = os.path.join(self.trace_dir, f"rank{self.rank}.{time.time_ns()}.pt.trace.json")
            try:
                os.makedirs(self.trace_dir, exist_ok=True)
                profiler.export_chrome_trace(path)
            except OSError as exc:
                log.warning("the profiler trace was not written to %s (%s); training goes on without it",
                            self.trace_dir, " ".join(str(exc).split()))
                return None
        finally:  # writing the trace is not training time
            self._exclude(time.perf_counter() - began)
        self.traces.append(path)
        log.info("profiler trace: %s (tensorboard --logdir %s, or ui.perfetto.dev)", path, self.trace_dir)
        return path


@contextlib.contextmanager
def _both(name: str, inner: AbstractContextManager[Any]) -> Iterator[None]:
    import torch.profiler

    with torch.profiler.record_function(name), inner:
        yield
