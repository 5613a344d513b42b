"""Checks of the hooks a Trainer observes the step with: regions, profiler, peak FLOP/s, memory, logging."""

from __future__ import annotations

import contextlib
import math
import os
import sys
import tempfile
from collections.abc import Iterator

import attrs
import torch

from devplug.core.contract import hookspecs
from devplug.core.contract.records import PRECISIONS, LogPoint, MemoryStats, PeakFlops
from devplug.core.contract.value_rules import memory_figure_problem
from devplug.core.errors import PrecisionError
from devplug.testing.kit import DeviceUnderTest, conformance_check

#: Regions the Trainer opens around the step (``data_wait`` since contract 1.2: `check_region_data_wait`).
REGIONS = ("forward", "backward", "optimizer_step", "data_wait")


@conformance_check("devplug_region")
def check_region(dut: DeviceUnderTest) -> str:
    """``devplug_region`` returns an enterable context manager (or ``None``) for each region of the step."""
    return _check_regions(dut, REGIONS[:3])


@conformance_check("devplug_region", since="1.2")
def check_region_data_wait(dut: DeviceUnderTest) -> str:
    """``devplug_region`` also answers the ``data_wait`` region (contract 1.2) as it answers the others."""
    return _check_regions(dut, ("data_wait",))


def _check_regions(dut: DeviceUnderTest, regions: tuple[str, ...]) -> str:
    for name in regions:
        ctx = dut.hooks(hookspecs.devplug_region, name=name)
        if ctx is None:
            continue
        if not (hasattr(ctx, "__enter__") and hasattr(ctx, "__exit__")):
            raise dut.fail(f"devplug_region({name!r}) returned {ctx!r}, not a context manager")
        try:
            with ctx:
                pass
        except Exception as exc:
            raise dut.fail(f"the devplug_region({name!r}) context failed: {type(exc).__name__}: {exc}") from exc
    return "regions: " + ", ".join(regions)


@conformance_check("devplug_profiler_activities", since="1.2")
def check_profiler_activities(dut: DeviceUnderTest) -> str:
    """``devplug_profiler_activities`` names ProfilerActivity values, CPU among them, that profile a step here."""
    activities = dut.hooks(hookspecs.devplug_profiler_activities)
    if activities is None:
        return "activities: deferred"
    kinds = torch.profiler.ProfilerActivity
    if not activities or not all(isinstance(a, kinds) for a in activities):
        raise dut.fail(f"devplug_profiler_activities returned {activities!r}, not a list of ProfilerActivity")
    if kinds.CPU not in activities:
        raise dut.fail("devplug_profiler_activities must include ProfilerActivity.CPU (data wait and regions)")
    supported = torch.profiler.supported_activities()  # type: ignore[no-untyped-call]  # unannotated in torch
    missing = [a.name for a in activities if a not in supported]
    if missing:
        raise dut.fail(f"devplug_profiler_activities names {missing}, which this torch cannot record "
                       f"(supported: {', '.join(a.name for a in supported)})")
    x = dut.hooks(hookspecs.devplug_to_device, obj=torch.ones(8, 8))
    # The profiler's native library (kineto) writes its own start/stop lines, and on a machine without the
    # GPU its build targets "ERROR: ... gpuGetDeviceCount failed", straight to the process's stderr. The
    # check holds that output back and shows it only when the profile fails, where it may say why.
    recorded, failure = False, None
    with native_stderr() as native:
        try:
            with torch.profiler.profile(activities=activities) as profiler, torch.profiler.record_function("probe"):
                (x @ x).sum()
                dut.hooks(hookspecs.devplug_synchronize)
            recorded = any(event.name == "probe" for event in profiler.events())
        except AssertionError:  # a hook broke the contract: the kit's own message says so
            raise
        except Exception as exc:
            failure = exc
    said = f"; the profiler printed: {native.text.strip()}" if native.text.strip() else ""
    if failure is not None:
        raise dut.fail(f"profiling with {[a.name for a in activities]} raised {type(failure).__name__}: "
                       f"{failure}{said}") from failure
    if not recorded:
        raise dut.fail(f"a profile with these activities did not record a record_function range{said}")
    return "activities: " + ", ".join(a.name for a in activities)


@attrs.define
class NativeOutput:
    """What native code wrote to file descriptor 2 inside `native_stderr` (set when it ends)."""

    text: str = ""


@contextlib.contextmanager
def native_stderr() -> Iterator[NativeOutput]:
    """Hold back what native libraries write to the process's stderr (file descriptor 2) inside the block.

    Python's ``sys.stderr`` is flushed first and keeps working; what was written comes back as
    ``NativeOutput.text``, for the caller to show when something failed.
    """
    captured = NativeOutput()
    try:
        saved = os.dup(2)
    except OSError:  # no file descriptor 2 (an embedded interpreter): nothing to hold back
        yield captured
        return
    with tempfile.TemporaryFile() as spool:
        sys.stderr.flush()
        os.dup2(spool.fileno(), 2)
        try:
            yield captured
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            spool.seek(0)
            captured.text = spool.read().decode(errors="replace")


@conformance_check("devplug_peak_flops", since="1.2")
def check_peak_flops(dut: DeviceUnderTest) -> str:
    """``devplug_peak_flops`` gives a positive, finite FLOP/s figure (``PeakFlops`` or float), or ``None``, per plan."""
    seen = []
    for precision in PRECISIONS:
        try:
            plan = dut.hooks(hookspecs.devplug_precision, precision=precision, strategy="none")
        except PrecisionError:
            continue  # the device refuses this setting: no plan, no peak
        if plan is None:
            continue
        peak = dut.hooks(hookspecs.devplug_peak_flops, precision=plan.name)
        value = peak.value if isinstance(peak, PeakFlops) else peak
        if value is not None and (not isinstance(value, float) or not math.isfinite(value) or value <= 0):
            raise dut.fail(f"devplug_peak_flops({plan.name!r}) returned {peak!r}, not a positive, finite float "
                           "(or a PeakFlops holding one)")
        source = f" ({peak.source})" if isinstance(peak, PeakFlops) else ""
        seen.append(f"{plan.name}: " + (f"{value / 1e12:.3g} TFLOP/s{source}" if value else "unknown"))
    return "peaks: " + "; ".join(dict.fromkeys(seen))


@conformance_check("devplug_synchronize", "devplug_memory_stats")
def check_synchronize_and_memory(dut: DeviceUnderTest) -> str:
    """``devplug_synchronize`` returns; ``devplug_memory_stats`` gives `MemoryStats` or ``None``."""
    hooks = dut.hooks
    hooks(hookspecs.devplug_to_device, obj=torch.ones(8)).sum()
    hooks(hookspecs.devplug_synchronize)
    stats = hooks(hookspecs.devplug_memory_stats)
    if stats is None:
        return "memory stats: not reported"
    if not isinstance(stats, MemoryStats):
        raise dut.fail(f"devplug_memory_stats returned {stats!r}, not a devplug.MemoryStats")
    problem = memory_figure_problem(stats)
    if problem is not None:
        raise dut.fail(f"MemoryStats.{problem[0]} must be a number of bytes or None, got {problem[1]!r}")
    return f"memory stats: {stats}"


@conformance_check("devplug_log", since="1.2")
def check_log(dut: DeviceUnderTest) -> str:
    """``devplug_log`` accepts a point with values, one with an image and the final one, and returns nothing."""
    points = (LogPoint(step=1, values={"loss": 0.5, "lr/model": 1e-3}),
              LogPoint(step=1, images={"grid": torch.rand(3, 4, 4)}), LogPoint(step=1, final=True))
    for point in points:
        # The spec types each plugin's answer (None); pluggy returns them all in a list. The guard names a raise.
        answers: list[object] | None = dut.hooks(hookspecs.devplug_log, point=point)
        if any(answer is not None for answer in answers or ()):
            raise dut.fail(f"devplug_log returned {answers!r}; it returns nothing")
    return "log points: values, images, final"
