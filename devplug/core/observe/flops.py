"""Model FLOPs utilisation (MFU) and cost: FLOPs per sample counted once, the device's peak from its plugin.

One training step (the second: the first carries one-time work) runs under
``torch.utils.flop_counter.FlopCounterMode``, which counts the FLOPs of every matmul and convolution,
forward and backward, from shapes alone (no host-device synchronisation). With the samples of that step
it gives FLOPs per sample; the achieved FLOP/s is that times the samples/s measured at log points, and
MFU is the achieved FLOP/s of one device over its peak for the precision in use, which the device plugin
reports through ``devplug_peak_flops`` (asked once, when first needed) with its source (a datasheet, a
computation, a measurement cached per machine), or the author gives (``peak_flops=``). ``price_per_hour``
(of the whole job) turns samples/s into samples per dollar.

Two views of the same achieved rate: MFU against the peak (the datasheet's or the processor's nominal
figure: what the hardware could do at best) and, on request, its fraction of a plain GEMM's rate in the
same number format on the same device (`plain_gemm_flops`: what a matmul actually reaches here, measured
once per machine), so a low MFU can be told apart from a peak that no kernel reaches.
"""

from __future__ import annotations

import functools
import logging
import math
import platform
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch

from devplug.core.contract.records import PeakFlops
from devplug.core.errors import PluginError
from devplug.core.fallback import accelerator
from devplug.core.log_once import log_once
from devplug.core.observe.summary import format_flops

log = logging.getLogger("devplug")

#: The training step whose FLOPs are counted.
COUNTED_STEP = 2

#: What torch says when a compiled module is called while module hooks are registered globally: the FLOP
#: counter's module tracker registers such hooks, and they only attribute FLOPs to modules (not counted here).
_COMPILED_WITH_HOOKS = r"Using `torch\.compile\(module\)` when there are global hooks"


def _compile_stood_aside() -> Any:
    """torch.compile's ``"force_eager"`` stance, set now (the returned object's ``__exit__`` restores the one
    before), or ``None`` when torch.compile was never loaded: then nothing is compiled, and loading it would
    cost a second."""
    if "torch._dynamo" not in sys.modules:
        return None
    return torch.compiler.set_stance("force_eager")


class FlopMeter:
    """Counts the FLOPs of step `COUNTED_STEP` and turns rates into MFU and samples per dollar.

    ``steps_done`` and ``samples_done`` read the loop's counters; ``peak`` asks for the device's peak
    (a checked `PeakFlops`; ``None``: unknown); ``exclude`` takes the seconds spent asking it out of
    the throughput clock; ``enabled=False`` counts nothing (MFU stays unknown). ``number_format`` names
    the format the run multiplies in (``"bf16"``), for the one-line description of the peak; ``gemm``,
    when given, measures a plain GEMM's FLOP/s in that format on the device (asked once, after the
    counted step, its time taken out of the throughput clock like the peak's).
    """

    def __init__(self, *, steps_done: Callable[[], int], samples_done: Callable[[], int],
                 peak: Callable[[], PeakFlops | float | None], exclude: Callable[[float], None] = lambda _s: None,
                 price_per_hour: float | None = None, enabled: bool = True, number_format: str = "",
                 gemm: Callable[[], float | None] | None = None) -> None:
        self._steps_done, self._samples_done, self._peak_hook = steps_done, samples_done, peak
        self._exclude = exclude
        self.price_per_hour = price_per_hour
        self.enabled = enabled
        self.number_format = number_format
        self._gemm_hook = gemm
        self._gemm: float | None = None
        self._gemm_asked = False
        self.flops_per_sample: float | None = None
        self._mode: Any = None
        self._stance: Any = None
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
            # a compiled model runs uncompiled under the counter, so its count is right: torch.compile is told
            # to stand aside for the step (older torch releases otherwise compile frames the counter's dispatch
            # reaches, a tensor subclass's __torch_dispatch__ among them); torch's warning about the counter's
            # global hooks is not for us
            self._stance = _compile_stood_aside()
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
        if self._stance is not None:
            stance, self._stance = self._stance, None
            stance.__exit__(None, None, None)  # the stance from before the counted step
        filters = warnings.filters  # (the author may have reset them meanwhile)
        if isinstance(filters, list) and self._quiet is not None and self._quiet in filters:
            filters.remove(self._quiet)
        samples = self._samples_done() - self._samples_at_start
        flops = mode.get_total_flops()
        if samples > 0 and flops > 0:
            self.flops_per_sample = flops / samples
        started = time.perf_counter()
        self.peak  # noqa: B018  (ask the plugin now; a measured peak's time is taken out of the throughput clock)
        self.gemm_flops  # noqa: B018  (likewise: measured now, if asked for, or read from the cache)
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

    @property
    def peak_line(self) -> str | None:
        """The peak in one line: value, number format, source and how it was obtained; ``None``: no peak.

        ``"166.2 GFLOP/s fp32, computed: 2 cores × 2.6 GHz × 32 FLOP/cycle (avx512f, fp32)"``.
        """
        record = self.peak_record
        if record is None:
            return None
        number_format = f" {self.number_format}" if self.number_format else ""
        detail = f": {record.detail}" if record.detail else ""
        return f"{format_flops(record.value)}{number_format}, {record.source}{detail}"

    @property
    def gemm_flops(self) -> float | None:
        """A plain GEMM's FLOP/s in the run's format on the device (asked once), or ``None``: not asked for.

        A measurement that fails (the device is out of memory, a format without matmul) is said once in
        the log and leaves it ``None``: a reporting figure never ends a training run.
        """
        if self._gemm_hook is not None and not self._gemm_asked:
            self._gemm_asked = True
            try:
                rate = self._gemm_hook()
            except (RuntimeError, ValueError, TypeError, OSError) as exc:
                log.warning("a plain GEMM's rate was not measured (%s): its fraction is not reported",
                            " ".join(str(exc).split())[:200])
                rate = None
            self._gemm = rate if rate is not None and rate > 0 and math.isfinite(rate) else None
            if self._gemm is not None:
                log.info("a plain %s GEMM runs at %s here", self.number_format or "", format_flops(self._gemm))
        return self._gemm

    def efficiency(self, samples_per_sec_per_device: float) -> dict[str, Any]:
        """The summary's view of efficiency at one device's rate: ``achieved_flops``, ``peak`` (one line),
        ``gemm_flops`` and ``gemm_fraction`` (achieved over a plain GEMM's rate), where known."""
        out: dict[str, Any] = {}
        if self.flops_per_sample is None:
            return out
        achieved = self.flops_per_sample * samples_per_sec_per_device
        out["achieved_flops"] = achieved
        if self._peak_asked and self.peak_record is not None:
            out["peak"] = self.peak_line
        if self._gemm_asked and self._gemm:
            out["gemm_flops"] = self._gemm
            out["gemm_fraction"] = achieved / self._gemm
        return out

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


#: The largest square matmul `measured_matmul_flops` times (three operands of 8192² fp32: 768 MiB).
MAX_MATMUL_SIZE = 8192
#: A matmul this long is all work: `measured_matmul_flops` grows its size no further.
LONG_MATMUL_SECONDS = 0.1


def matmul_seconds(a: torch.Tensor, b: torch.Tensor, device: torch.device) -> float:
    """Seconds of one ``a @ b`` on ``device``, waiting for the device (nothing is read back to the host)."""
    started = time.perf_counter()
    a @ b
    accelerator.synchronize(device)
    return time.perf_counter() - started


def measured_matmul_flops(device_type: str, dtype: torch.dtype, seconds: float = 0.25) -> float:
    """FLOP/s of a square matmul on ``device_type`` in ``dtype``: the best run over ``seconds``, measured once
    per process for each number of threads torch uses and each fp32 matmul precision (see `timed_matmul_flops`)."""
    return _measured_once(device_type, dtype, seconds, torch.get_num_threads(), torch.get_float32_matmul_precision())


@functools.cache
def _measured_once(device_type: str, dtype: torch.dtype, seconds: float, _threads: int, _fp32_precision: str) -> float:
    return timed_matmul_flops(device_type, dtype, seconds)


def timed_matmul_flops(device_type: str, dtype: torch.dtype, seconds: float = 0.25) -> float:
    """FLOP/s of a square matmul on ``device_type`` in ``dtype``: the best run over ``seconds``, timed now.

    The size doubles from 256 while the matmul's rate still grows with its size (the work does not yet
    dominate the call) or one matmul takes under 20 ms, up to 8192 (a GPU's tensor cores need large
    operands to approach their rate), and never past a size whose matmul takes `LONG_MATMUL_SECONDS` (on a
    busy host, noise can look like growth, and a CPU's 8192² fp32 matmul takes seconds). A slow format
    (bf16 on a CPU without native bf16) stays quick to measure, and a moment when another process held a
    core, which makes a small matmul wait for it for tens of milliseconds, does not end the search at a
    size whose time is that wait. Then it runs for
    ``seconds`` (5 times at least) and keeps the fastest, so a moment when another process had the cores
    does not lower the figure. A measured peak for devices without a published figure (the host CPU):
    what the device achieves on the operation training spends most of its time in, so MFU against it
    lies in (0, 1] for real models. Nothing is read back to the host.
    """
    device = torch.device(device_type)
    size, rate_before = 256, 0.0
    while True:
        # constant operands: matmul time does not depend on the values, and the training's RNG is not drawn from
        a = torch.full((size, size), 0.5, device=device, dtype=dtype)
        b = torch.full((size, size), 0.25, device=device, dtype=dtype)
        matmul_seconds(a, b, device)  # warm-up
        best = min(matmul_seconds(a, b, device) for _ in range(3))
        rate = 2.0 * size**3 / best
        still_growing = rate > 1.5 * rate_before
        if size >= MAX_MATMUL_SIZE or best >= LONG_MATMUL_SECONDS or (best >= 0.02 and not still_growing):
            break
        size, rate_before = size * 2, rate
    runs, deadline = 0, time.perf_counter() + seconds
    while runs < 5 or time.perf_counter() < deadline:
        best, runs = min(best, matmul_seconds(a, b, device)), runs + 1
    return 2.0 * size**3 / best


#: Short names of the number formats a matmul runs in.
FORMAT_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.float64: "fp64"}


def format_name(dtype: torch.dtype) -> str:
    """The short name of ``dtype`` (``"bf16"``; another dtype: torch's name without ``torch.``)."""
    return FORMAT_NAMES.get(dtype, str(dtype).removeprefix("torch."))


def precision_dtype(precision: str) -> torch.dtype:
    """The dtype a precision setting multiplies in: its registered precision's (float32 for another name)."""
    from devplug.core.precision.registry import find

    known = find(precision)
    return known.compute_dtype if known is not None else torch.float32


def device_model(device: torch.device) -> str:
    """What names ``device``'s hardware in a cache key: torch's device name where it has one (a GPU's
    model), else the host's processor and name (the CPU: one entry per machine)."""
    from devplug.core.fallback.accelerator import device_module

    module = device_module(device.type)
    name_of = getattr(module, "get_device_name", None)  # torch.cpu has none
    if callable(name_of):
        try:
            return str(name_of(device.index if device.index is not None else 0))
        except (RuntimeError, AssertionError, ValueError, TypeError):
            pass
    return f"{platform.processor() or platform.machine()} on {platform.node() or 'this host'}"


def plain_gemm_flops(device: torch.device | str, dtype: torch.dtype) -> float:
    """The FLOP/s of a plain square GEMM (``a @ b``) in ``dtype`` on ``device``: what a matmul reaches here.

    Measured once per machine (`measured_matmul_flops`, then kept in devplug's cache, see
    `cached_matmul_flops`) under torch's current matmul settings (for fp32, its
    ``float32_matmul_precision``: TF32 or not). The achievable view next to MFU's datasheet view: a
    run's achieved FLOP/s over this says how close its step comes to the device's best plain kernel.
    """
    place = torch.device(device)
    return cached_matmul_flops(place.type, dtype, device_model(place))


def cached_matmul_flops(device_type: str, dtype: torch.dtype, model: str) -> float:
    """`measured_matmul_flops`, measured once per machine and then read from devplug's cache.

    ``model`` names the device (a CPU's model name); the cache key adds the threads torch uses, the
    number format (for fp32: torch's ``float32_matmul_precision`` where not ``"highest"``) and the
    torch version, so a change to any of them measures again. Later runs, busy
    host or idle, read the same figure (see `devplug.core.observe.peak_cache`).
    """
    from devplug.core.observe.peak_cache import cached_peak

    key = f"{device_type} | {model} | {torch.get_num_threads()} threads | {dtype} | torch {torch.__version__}"
    if dtype == torch.float32 and torch.get_float32_matmul_precision() != "highest":  # TF32 or bf16 inside
        key += f" | float32 matmul {torch.get_float32_matmul_precision()}"
    return cached_peak(key, lambda: measured_matmul_flops(device_type, dtype))
