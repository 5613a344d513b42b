"""Model FLOPs utilisation (MFU) and cost: FLOPs per sample counted once, the device's peak from its plugin.

One training step (the second: the first carries one-time work) runs under
``torch.utils.flop_counter.FlopCounterMode``, which counts the FLOPs of every matmul and convolution,
forward and backward, from shapes alone (no host-device synchronisation). With the samples of that step
it gives FLOPs per sample; the achieved FLOP/s is that times the samples/s measured at log points, and
MFU is the achieved FLOP/s of one device over its peak for the precision in use, which the device plugin
reports through ``devplug_peak_flops`` (asked once, when first needed) with its source (a datasheet, a
computation, a measurement cached per machine), or the author gives (``peak_flops=``). ``price_per_hour``
(of the whole job) turns samples/s into samples per dollar.
"""

from __future__ import annotations

import functools
import logging
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch

from devplug.core.contract.records import PeakFlops
from devplug.core.errors import PluginError
from devplug.core.fallback import accelerator
from devplug.core.log_once import log_once

log = logging.getLogger("devplug")

#: The training step whose FLOPs are counted.
COUNTED_STEP = 2

#: What torch says when a compiled module is called while module hooks are registered globally: the FLOP
#: counter's module tracker registers such hooks, and they only attribute FLOPs to modules (not counted here).
_COMPILED_WITH_HOOKS = r"Using `torch\.compile\(module\)` when there are global hooks"


class FlopMeter:
    """Counts the FLOPs of step `COUNTED_STEP` and turns rates into MFU and samples per dollar.

    ``steps_done`` and ``samples_done`` read the loop's counters; ``peak`` asks for the device's peak
    (a checked `PeakFlops`; ``None``: unknown); ``exclude`` takes the seconds spent asking it out of
    the throughput clock; ``enabled=False`` counts nothing (MFU stays unknown).
    """

    def __init__(self, *, steps_done: Callable[[], int], samples_done: Callable[[], int],
                 peak: Callable[[], PeakFlops | float | None], exclude: Callable[[float], None] = lambda _s: None,
                 price_per_hour: float | None = None, enabled: bool = True) -> None:
        self._steps_done, self._samples_done, self._peak_hook = steps_done, samples_done, peak
        self._exclude = exclude
        self.price_per_hour = price_per_hour
        self.enabled = enabled
        self.flops_per_sample: float | None = None
        self._mode: Any = None
        self._quiet: Any = None
        self._samples_at_start = 0
        self._peak: PeakFlops | None = None
        self._peak_asked = False

    def before_batch(self) -> None:
        """Called when the loop asks for the next training batch: start or finish the counted step here."""
        if not self.enabled or (self._mode is None and self.flops_per_sample is not None):
            return  # nothing to start or finish: counted already
        upcoming = self._steps_done() + 1
        if self._mode is None and upcoming == COUNTED_STEP and self.flops_per_sample is None:
            from torch.utils.flop_counter import FlopCounterMode

            self._mode = FlopCounterMode(display=False)
            # a compiled model runs uncompiled under the counter (torch.compile steps aside for a dispatch
            # mode), so its count is right; torch's warning about the counter's global hooks is not for us
            before = list(warnings.filters)
            warnings.filterwarnings("ignore", message=_COMPILED_WITH_HOOKS, category=UserWarning)
            self._quiet = None if warnings.filters[0] in before else warnings.filters[0]  # the author's own stays
            self._mode.__enter__()
            self._samples_at_start = self._samples_done()
        elif self._mode is not None and upcoming > COUNTED_STEP:
            self.stop()

    def stop(self) -> None:
        """Finish counting (the loop ended or the counted step is done)."""
        if self._mode is None:
            return
        mode, self._mode = self._mode, None
        mode.__exit__(None, None, None)
        filters = warnings.filters  # (the author may have reset them meanwhile)
        if isinstance(filters, list) and self._quiet is not None and self._quiet in filters:
            filters.remove(self._quiet)
        samples = self._samples_done() - self._samples_at_start
        flops = mode.get_total_flops()
        if samples > 0 and flops > 0:
            self.flops_per_sample = flops / samples
        started = time.perf_counter()
        self.peak  # noqa: B018  (ask the plugin now; a measured peak's time is taken out of the throughput clock)
        self._exclude(time.perf_counter() - started)

    @property
    def peak(self) -> float | None:
        """The device's peak FLOP/s for the precision in use (asked once), or ``None``."""
        record = self.peak_record
        return record.value if record is not None else None

    @property
    def peak_record(self) -> PeakFlops | None:
        """The peak with its source (asked once, said once in the log), or ``None``.

        A plugin whose answer is refused (a peak that is not positive and finite, or an exception in its hook)
        leaves it ``None`` with one warning naming the plugin: MFU is then not reported.
        """
        if not self._peak_asked:
            self._peak_asked = True
            try:
                answer = self._peak_hook()
            except PluginError as exc:  # a reporting figure never ends a training run
                log.warning("MFU not reported: %s", " ".join(str(exc).split()))
                answer = None
            self._peak = answer if answer is None or isinstance(answer, PeakFlops) else PeakFlops(answer, "plugin")
            if self._peak is not None:
                detail = f": {self._peak.detail}" if self._peak.detail else ""
                log.info("MFU against a peak of %.4g GFLOP/s (%s%s)", self._peak.value / 1e9, self._peak.source,
                         detail)
        return self._peak

    def figures(self, samples_per_sec_per_device: float, samples_per_sec: float) -> dict[str, float]:
        """``flops_per_sample``, ``peak_flops``, ``mfu`` and ``samples_per_dollar`` where known, for the given rates."""
        out: dict[str, float] = {}
        if self.flops_per_sample is not None:
            out["flops_per_sample"] = self.flops_per_sample
            if self._peak_asked and self.peak:
                mfu = self.flops_per_sample * samples_per_sec_per_device / self.peak
                out["peak_flops"] = self.peak
                if mfu <= 1.0:
                    out["mfu"] = mfu
                else:  # a peak measured while other work had the cores: no honest MFU from it
                    log_once(f"MFU not reported: the device's peak ({self.peak / 1e9:.3g} GFLOP/s) is below what "
                             f"training achieved ({mfu * self.peak / 1e9:.3g} GFLOP/s); the peak "
                             f"({self._peak.source if self._peak else 'unknown'}) is too low", logging.WARNING)
        if self.price_per_hour:
            out["samples_per_dollar"] = samples_per_sec * 3600 / self.price_per_hour
        return out


@functools.cache
def measured_matmul_flops(device_type: str, dtype: torch.dtype, seconds: float = 0.25) -> float:
    """FLOP/s of a square matmul on ``device_type`` in ``dtype``: the best run over ``seconds`` (once per process).

    The size doubles from 256 until one matmul takes 20 ms (at most 2048), so a slow format (bf16 on a CPU
    without native bf16) stays quick to measure; then it runs for ``seconds`` (5 times at least) and keeps
    the fastest, so a moment when another process had the cores does not lower the figure. A measured peak
    for devices without a published figure (the host CPU): what the device achieves on the operation
    training spends most of its time in, so MFU against it lies in (0, 1] for real models. Nothing is read
    back to the host.
    """
    device = torch.device(device_type)

    def timed(a: torch.Tensor, b: torch.Tensor) -> float:
        started = time.perf_counter()
        a @ b
        accelerator.synchronize(device)  # waits for the device, reads nothing back
        return time.perf_counter() - started

    size = 256
    while True:
        # constant operands: matmul time does not depend on the values, and the training's RNG is not drawn from
        a = torch.full((size, size), 0.5, device=device, dtype=dtype)
        b = torch.full((size, size), 0.25, device=device, dtype=dtype)
        timed(a, b)  # warm-up
        if min(timed(a, b) for _ in range(2)) >= 0.02 or size >= 2048:
            break
        size *= 2
    best, runs, deadline = float("inf"), 0, time.perf_counter() + seconds
    while runs < 5 or time.perf_counter() < deadline:
        best, runs = min(best, timed(a, b)), runs + 1
    return 2.0 * size**3 / best


def cached_matmul_flops(device_type: str, dtype: torch.dtype, model: str) -> float:
    """`measured_matmul_flops`, measured once per machine and then read from devplug's cache.

    ``model`` names the device (a CPU's model name); the cache key adds the threads torch uses, the
    number format and the torch version, so a change to any of them measures again. Later runs, busy
    host or idle, read the same figure (see `devplug.core.observe.peak_cache`).
    """
    from devplug.core.observe.peak_cache import cached_peak

    key = f"{device_type} | {model} | {torch.get_num_threads()} threads | {dtype} | torch {torch.__version__}"
    return cached_peak(key, lambda: measured_matmul_flops(device_type, dtype))
