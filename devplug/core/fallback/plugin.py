"""The core's fallback plugin: device-generic PyTorch for every first-result hook.

Registered before all others and marked ``trylast``, so any device or neutral plugin that answers
a hook takes precedence. It speaks only PyTorch's device-generic API (``torch.accelerator``,
``torch.get_device_module``, ``torch.amp``, the distributed backend map, see
``devplug.core.fallback.accelerator``), never a device name, so a device plugin that only declares its
device is correct, and implements the hooks where it can be faster.
"""

from __future__ import annotations

import contextlib
import platform
from typing import Any

import torch

from devplug.core.contract.hookimpl import hookimpl
from devplug.core.contract.records import (
    CollectiveSetup,
    CompilePlan,
    Device,
    DoctorReport,
    LaunchInfo,
    LoaderChoice,
    LoaderOptions,
    MemoryStats,
    OptimizerChoice,
    PrecisionPlan,
    ShardingPlan,
    StepMarks,
)
from devplug.core.fallback import accelerator
from devplug.core.fallback.precision import torch_precision_plan
from devplug.core.fallback.sharding import torch_sharding_plan
from devplug.core.optim.torch_optimizers import fastest_torch_optimizer
from devplug.core.tree import move_to


@hookimpl(trylast=True)
def devplug_to_device(device: Device, obj: Any) -> Any:
    """Plain ``.to(device)``; non-blocking copies from pinned memory; channels_last when the Trainer asks."""
    return move_to(obj, device.torch_device, memory_format=device.memory_format)


@hookimpl(trylast=True)
def devplug_device_setup(device: Device) -> None:
    """Make ``NAME:INDEX`` the current device of its type (``torch.accelerator.set_device_index``)."""
    if device.index is not None:
        accelerator.select_device(device.torch_device.type, device.index)


@hookimpl(trylast=True)
def devplug_optimizer(device: Device, name: str, params: Any, options: dict[str, Any]) -> OptimizerChoice:
    """torch.optim with torch's fastest kernel for the device type: ``fused=True``, else ``foreach=True``."""
    return fastest_torch_optimizer(device, name, params, options)


@hookimpl(trylast=True)
def devplug_precision(device: Device, precision: str) -> PrecisionPlan:
    """torch.autocast; ``"auto"`` is bf16 where torch reports autocast and native bf16 for the type, else fp32."""
    return torch_precision_plan(device, precision)


@hookimpl(trylast=True)
def devplug_sharding(device: Device, precision: str) -> ShardingPlan:
    """FSDP where torch has a collective backend for the device type; fp32 reductions; the foreach kernel."""
    return torch_sharding_plan(device, precision)


@hookimpl(trylast=True)
def devplug_region(device: Device, name: str) -> Any:
    """No region marking."""
    return contextlib.nullcontext()


@hookimpl(trylast=True)
def devplug_step_marks(device: Device) -> StepMarks:
    """Nothing marked: the fallback's region is a context that does nothing, and it marks no step."""
    return StepMarks(regions=False, steps=False)


@hookimpl(trylast=True)
def devplug_clip_grad_norm(
    device: Device, parameters: list[torch.Tensor], max_norm: float, norm_type: float
) -> torch.Tensor:
    """``torch.nn.utils.clip_grad_norm_`` (its multi-tensor ``foreach`` kernels where torch has them for the device)."""
    return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)


@hookimpl(trylast=True)
def devplug_collective_setup(device: Device, launch: LaunchInfo) -> CollectiveSetup:
    """torch's backend for the device type (``Backend.default_device_backend_map``, gloo where none); local device."""
    kind = device.torch_device.type
    if accelerator.is_current_accelerator(kind):
        count = accelerator.device_count(kind)
        if device.index is not None or count > 0:
            accelerator.select_device(kind, device.index if device.index is not None else launch.local_rank % count)
    return CollectiveSetup(backend=accelerator.collective_backend(kind))


@hookimpl(trylast=True)
def devplug_dataloader(device: Device, source: Any, options: LoaderOptions) -> LoaderChoice:
    """A ``torch.utils.data.DataLoader`` tuned by measuring the source (the author's explicit settings win).

    Compute competes with loading for the host's cores unless the device type is torch's current
    accelerator (``torch.accelerator``); a device plugin that knows better says so itself.
    """
    competes = not accelerator.is_current_accelerator(device.torch_device.type)
    from devplug.core.data.torch_loader import torch_dataloader  # the image pipeline: only when a loader is built

    return torch_dataloader(source, options, compute_competes=competes)


@hookimpl(trylast=True)
def devplug_synchronize(device: Device) -> bool:
    """``torch.accelerator.synchronize``, else the device module's ``synchronize``; False when torch has neither."""
    return accelerator.synchronize(device.torch_device)


@hookimpl(trylast=True)
def devplug_memory_stats(device: Device) -> MemoryStats | None:
    """``torch.accelerator`` memory statistics, else the device module's; None where torch reports nothing."""
    return accelerator.memory_stats(device.torch_device)


@hookimpl(trylast=True)
def devplug_compile_plan(device: Device) -> CompilePlan:
    """``torch.compile``'s default backend, inductor (C++/OpenMP on the CPU, Triton on GPUs)."""
    return CompilePlan(backend="inductor", reason="torch.compile's default backend")


@hookimpl(trylast=True)
def devplug_compile(device: Device, module: torch.nn.Module, options: dict[str, Any]) -> Any:
    """``torch.compile`` with its default backend."""
    return torch.compile(module, **options)


@hookimpl(trylast=True)
def devplug_doctor() -> DoctorReport:
    """Python, the platform, torch and the accelerator torch itself sees; the launcher's and devplug's variables."""
    kind = accelerator.current_accelerator_type()
    return DoctorReport(
        packages=("pluggy", "attrs", "tensorboard", "torchvision", "mlflow-skinny"),
        versions={"torch": torch.__version__, "python": platform.python_version(),
                  "platform": f"{platform.system()} {platform.machine()}",
                  "torch built for accelerator": kind or "none"},
        env=("DEVPLUG_*", "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "OMP_NUM_THREADS",
             "TORCH_DISTRIBUTED_DEBUG", "TORCH_LOGS"),
    )


@hookimpl(trylast=True)
def devplug_profiler_activities(device: Device) -> list[torch.profiler.ProfilerActivity]:
    """CPU, plus the activity named like the device type (``CUDA``, ``XPU``, ``HPU``, ...) where torch records it."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    own = getattr(torch.profiler.ProfilerActivity, device.torch_device.type.upper(), None)
    if own is not None and own not in activities and own in torch.profiler.supported_activities():
        activities.append(own)
    return activities


@hookimpl(trylast=True)
def devplug_peak_flops(device: Device, precision: str) -> float | None:
    """Unknown: torch publishes no peak figures (MFU is then not reported)."""
    return None
