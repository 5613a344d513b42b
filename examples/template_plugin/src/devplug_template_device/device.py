"""The ``cpusim`` device plugin: a simulated accelerator that runs on the host CPU under its own name.

Copy this module to start a real device plugin: every hook of devplug's contract is implemented here,
each with what a real accelerator would do in its place. A device plugin only *has* to implement
``devplug_register_devices``; for any other hook it leaves out, devplug's core fallback (plain,
device-neutral PyTorch) answers. Because devplug routes operational hooks to the plugin of the
resolved device only, none of these functions needs to ask "is this my device?".

Rules the conformance kit (``devplug.testing``) checks:

- ``devplug_register_devices`` is cheap and imports no vendor runtime; availability is a probe that
  returns ``devplug.Availability`` and never raises;
- first-result hooks return a record (or ``None`` to defer to the next plugin, ultimately the fallback);
- ``devplug_mark_step`` never synchronizes with the host;
- ``devplug_precision`` gives a grad scaler to ``16-mixed`` only (fp16 gradients underflow without one;
  bf16 and fp32 need none);
- an optimizer that does not keep torch.optim's state layout needs ``to_canonical``/``from_canonical``
  converters on its ``OptimizerChoice`` (this one builds torch's own classes, so it needs none);
- the probe, ``devplug_doctor`` and ``devplug_precision`` answer within ``DEVPLUG_PROBE_TIMEOUT`` seconds
  (default 10): past it the device is unavailable, the doctor section left out, the Trainer stopped.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import resource
from typing import Any

import attrs
import torch

import devplug
from devplug.toolkit import (
    find_precision,
    measured_matmul_flops,
    move_to,
    precision_plan,
    torch_dataloader,
    torch_optimizer_class,
    torch_sharding_plan,
)

#: The hook contract this plugin was written for (``devplug.CONTRACT_VERSION`` when it was written).
#: devplug skips, with a clear message, a plugin written for a newer contract or another major version.
DEVPLUG_CONTRACT = "1.9"

NAME = "cpusim"
#: Setting this variable makes the device report itself unavailable (to see a probe's reason in action).
ENV_DISABLE = "CPUSIM_DISABLE"

log = logging.getLogger(__name__)

#: How often the Trainer marked each step phase on this device (a lazy device would flush here).
MARKED: collections.Counter[str] = collections.Counter()

#: Optimizers this device builds itself; every other name is deferred to devplug's fallback.
OWN_OPTIMIZERS = ("adam", "adamw", "sgd")


def probe() -> devplug.Availability:
    """Is the device usable here? A real plugin imports its runtime lazily *here*, never at import time.

    Never raise: answer ``Availability.no(reason, fix)`` so ``devplug devices`` and error messages can
    say why and what to do.
    """
    if os.environ.get(ENV_DISABLE, "").strip() not in ("", "0"):
        return devplug.Availability.no(f"{ENV_DISABLE} is set", f"unset {ENV_DISABLE} to use the simulated device")
    return devplug.Availability.yes()


@devplug.hookimpl
def devplug_register_devices() -> devplug.DeviceSpec:
    """Announce ``cpusim``: tensors live on ``"cpu"``; priority below the CPU so ``auto`` never picks it.

    Built-in priorities: cpu 0, cuda 50, hpu 100. A real accelerator picks a value above the devices
    it should win against in ``auto``; a simulator or debugging device stays below 0.
    """
    return devplug.DeviceSpec(
        name=NAME,
        description="simulated accelerator on the host CPU (devplug template plugin)",
        priority=-10,
        probe=probe,
        count=lambda: 1,
        torch_type="cpu",
    )


@devplug.hookimpl
def devplug_device_setup(device: devplug.Device) -> None:
    """Prepare the process once per Trainer: import the runtime, pick the local device, set global flags.

    ``device.options`` carries ``Trainer(device_options={...})``; this device understands ``threads``.
    """
    threads = device.options.get("threads")
    if threads:
        torch.set_num_threads(int(threads))
    log.debug("%s set up for %s (threads=%s)", NAME, device, torch.get_num_threads())


@devplug.hookimpl
def devplug_to_device(device: devplug.Device, obj: Any) -> Any:
    """Move a module, tensor or nested batch; honours ``device.channels_last`` (the Trainer option)."""
    return move_to(obj, device.torch_device, memory_format=device.memory_format)


@devplug.hookimpl
def devplug_optimizer(
    device: devplug.Device, name: str, params: Any, options: dict[str, Any]
) -> devplug.OptimizerChoice | None:
    """Multi-tensor (``foreach``) torch optimizers for adam/adamw/sgd; ``None`` defers other names.

    A real plugin returns its vendor's fused optimizer here, mapping the author's options faithfully,
    and says in ``reason`` why it fell back when the fast one cannot be used.
    """
    key = name.lower()
    if key not in OWN_OPTIMIZERS or "foreach" in options or "fused" in options:
        return None
    cls = torch_optimizer_class(key)
    return devplug.OptimizerChoice(cls(params, foreach=True, **options), f"torch.optim.{cls.__name__}(foreach=True)")


@devplug.hookimpl
def devplug_precision(device: devplug.Device, precision: str) -> devplug.PrecisionPlan:
    """``auto`` → fp32; any precision computing in fp16 refused (the simulator has no fp16); the rest as planned.

    Refusing a setting is part of the contract: raise ``devplug.PrecisionError`` saying what to use. A
    precision is an object (``find_precision``): the plugin reads its compute dtype and asks it for its
    plan with the device's parameters (``precision_plan``) rather than restating it.
    """
    if precision == "auto":
        precision = "32-true"
    known = find_precision(precision)
    if known is not None and known.compute_dtype == torch.float16:
        raise devplug.PrecisionError(f"{NAME} has no fp16 units; use precision='bf16-mixed' or '32-true'")
    plan = precision_plan(device, precision)  # an unknown name is a PrecisionError listing the known ones
    return attrs.evolve(plan, description=f"{NAME}: {plan.description}")


@devplug.hookimpl
def devplug_region(device: devplug.Device, name: str) -> contextlib.AbstractContextManager[Any]:
    """A ``torch.profiler`` range per region, so traces show ``cpusim:forward`` and so on."""
    return torch.profiler.record_function(f"{NAME}:{name}")


@devplug.hookimpl
def devplug_profiler_activities(device: devplug.Device) -> list[torch.profiler.ProfilerActivity]:
    """What a profiler window records: the CPU alone here (a real device adds its own activity, e.g. CUDA)."""
    return [torch.profiler.ProfilerActivity.CPU]


@devplug.hookimpl
def devplug_peak_flops(device: devplug.Device, precision: str) -> float | None:
    """The device's peak FLOP/s for the plan named ``precision``, for MFU: measured here, once per process.

    A real plugin returns the datasheet figure for the model it finds (``None`` when it does not know it).
    """
    known = find_precision(precision)
    return measured_matmul_flops("cpu", known.compute_dtype if known is not None else torch.float32)


@devplug.hookimpl
def devplug_mark_step(device: devplug.Device, phase: devplug.Phase) -> None:
    """Where a lazy-mode device flushes its accumulated graph (Gaudi: ``htcore.mark_step()``).

    The simulator executes eagerly, so it only counts. Never synchronize with the host here.
    """
    MARKED[phase.value] += 1


@devplug.hookimpl
def devplug_step_marks(device: devplug.Device) -> devplug.StepMarks:
    """What the two hooks above mark, stated once per Trainer: the step leaves out a hook that marks nothing.

    Both mark here (profiler ranges, step counts). A real eager device that marks no step says
    ``steps=False`` (and a region that only marks while profiling says ``regions=bool(...)``), so its step
    calls neither hook.
    """
    return devplug.StepMarks(regions=True, steps=True)


@devplug.hookimpl
def devplug_clip_grad_norm(
    device: devplug.Device, parameters: list[torch.Tensor], max_norm: float, norm_type: float
) -> torch.Tensor:
    """Clip in place and return the total norm before clipping, as a tensor (never ``.item()``: no host sync).

    A real plugin calls its fused kernel here (Gaudi: ``FusedClipNorm``); the Trainer has already unscaled.
    """
    return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type, foreach=True)


@devplug.hookimpl
def devplug_collective_setup(device: devplug.Device, launch: devplug.LaunchInfo) -> devplug.CollectiveSetup:
    """gloo (the backend that runs on CPU tensors), DDP writing gradients straight into its buckets.

    A real plugin imports its collective library here (which registers the backend with
    ``torch.distributed.Backend.register_backend``) and selects ``launch.local_rank``'s device.
    """
    return devplug.CollectiveSetup(backend="gloo", ddp_kwargs={"gradient_as_bucket_view": True})


@devplug.hookimpl
def devplug_dataloader(
    device: devplug.Device, source: Any, options: devplug.LoaderOptions
) -> devplug.LoaderChoice:
    """A torch DataLoader without pinned memory (batches stay in host memory, so pinning only costs).

    A real plugin returns its vendor loader here when ``source`` suits it (e.g. an
    ``ImageFolderSource`` decoded on the device, with ``on_device=True``) and defers otherwise.
    """
    if options.pin_memory is None:
        options = attrs.evolve(options, pin_memory=False)
    choice = torch_dataloader(source, options)
    return attrs.evolve(choice, implementation=f"{NAME}: {choice.implementation}")


@devplug.hookimpl
def devplug_sharding(device: devplug.Device, precision: str) -> devplug.ShardingPlan:
    """FSDP over gloo, as on the CPU: parameters gathered in fp32, torch's foreach kernel over the shards.

    A real plugin says here which dtypes its collective library gathers and reduces in, whether shards can
    wait in host memory (CPU offload), and which of its optimizers take DTensor parameters.
    """
    return torch_sharding_plan(device, precision, gather_low_precision=False,
                               optimizer_reason="torch.optim's foreach kernel over DTensor shards")


@devplug.hookimpl
def devplug_synchronize(device: devplug.Device) -> bool:
    """Wait for queued work; eager CPU execution has none. Return True: handled."""
    return True


@devplug.hookimpl
def devplug_memory_stats(device: devplug.Device) -> devplug.MemoryStats:
    """Peak resident memory of the process, as the device's "peak allocated"."""
    try:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    except (OSError, ValueError):
        peak = None
    return devplug.MemoryStats(peak_allocated=peak)


@devplug.hookimpl
def devplug_compile(device: devplug.Device, module: torch.nn.Module, options: dict[str, Any]) -> Any:
    """``torch.compile`` with the device's backend: ``"eager"`` here (a real device names its own,
    e.g. ``"hpu_backend"``); the author's ``backend`` option wins."""
    options = dict(options)
    backend = options.pop("backend", "eager")
    return torch.compile(module, backend=backend, **options)


@devplug.hookimpl
def devplug_compile_plan(device: devplug.Device) -> devplug.CompilePlan:
    """The backend ``Trainer(compile=True)`` compiles with: ``"eager"`` here (a real device names its own, e.g.
    ``"hpu_backend"``, or ``backend=None`` with the reason when its runtime builds graphs itself)."""
    return devplug.CompilePlan(backend="eager", reason="the simulated device runs PyTorch's eager kernels")


#: The log points this plugin received (rank 0), last one last: a real plugin sends them to its tracker.
LOGGED: list[devplug.LogPoint] = []


@devplug.hookimpl
def devplug_log(device: devplug.Device, point: devplug.LogPoint) -> None:
    """Receive each log point on this device: host floats already averaged, never a device tensor.

    A device plugin sees the points of its own device; a device-neutral plugin (a tracker) sees every one.
    """
    LOGGED.append(point)
    del LOGGED[:-10]


@devplug.hookimpl
def devplug_doctor() -> devplug.DoctorReport:
    """What ``devplug doctor`` prints for this plugin: its stack, the variables it reads, what is wrong here."""
    warnings = [f"{ENV_DISABLE} is set: {NAME} reports itself unavailable"] if not probe().available else []
    return devplug.DoctorReport(packages=("devplug-template-device", "torch"), env=(ENV_DISABLE,),
                                warnings=tuple(warnings))
