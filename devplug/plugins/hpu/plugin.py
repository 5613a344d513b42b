"""Hook implementations of the Gaudi (HPU) plugin; each delegates to the module that owns the topic."""

from __future__ import annotations

from typing import Any

import torch

from devplug import (
    CONTRACT_VERSION,
    CollectiveSetup,
    CompilePlan,
    Device,
    DeviceSpec,
    DoctorReport,
    LaunchInfo,
    LoaderChoice,
    LoaderOptions,
    MemoryStats,
    OptimizerChoice,
    PeakFlops,
    Phase,
    PrecisionPlan,
    ShardingPlan,
    hookimpl,
)
from devplug.plugins.hpu import clipping, distributed, doctor, mode, peaks, probe, sharding, stats
from devplug.plugins.hpu import precision as precision_plans

#: The contract these hooks implement: a built-in always speaks the contract of the devplug it ships in.
DEVPLUG_CONTRACT = CONTRACT_VERSION


@hookimpl
def devplug_register_devices() -> DeviceSpec:
    """Intel Gaudi accelerators: highest built-in priority, probed only when availability matters."""
    return DeviceSpec(
        name="hpu",
        description="Intel Gaudi (HPU): lazy-mode mark_step or eager + torch.compile, FusedAdamW/FusedSGD, "
        "bf16 autocast or HMP, HCCL, HabanaDataLoader",
        priority=100,
        probe=probe.probe,
        count=probe.device_count,
        torch_type=probe.TORCH_DEVICE_TYPE,
    )


@hookimpl
def devplug_device_setup(device: Device) -> None:
    """Import ``habana_frameworks.torch.core`` (htcore) and settle lazy or eager mode."""
    mode.activate(device)


@hookimpl
def devplug_optimizer(device: Device, name: str, params: Any, options: dict[str, Any]) -> OptimizerChoice | None:
    """``FusedAdamW`` for "adamw" and "adam", ``FusedSGD`` for "sgd"; torch's otherwise, with the reason."""
    from devplug.plugins.hpu import optimizers  # with its state converters: only when an optimizer is built

    return optimizers.build_optimizer(device, name, params, options)


@hookimpl
def devplug_precision(device: Device, precision: str) -> PrecisionPlan:
    """bf16 autocast for "auto"/"bf16-mixed", HMP for "hmp" (or the ``hmp`` device option), fp32 for "32-true"."""
    return precision_plans.plan_precision(device, precision)


@hookimpl
def devplug_mark_step(device: Device, phase: Phase) -> None:
    """``htcore.mark_step()`` after backward and after each optimizer step in lazy mode; nothing in eager."""
    mode.mark_step(device, phase)


@hookimpl
def devplug_clip_grad_norm(device: Device, parameters: list[torch.Tensor], max_norm: float,
                           norm_type: float) -> torch.Tensor | None:
    """``hpex.normalization.FusedClipNorm`` for the L2 norm; torch's ``clip_grad_norm_`` otherwise."""
    return clipping.clip_grad_norm(device, parameters, max_norm, norm_type)


@hookimpl
def devplug_collective_setup(device: Device, launch: LaunchInfo) -> CollectiveSetup:
    """HCCL through ``initialize_distributed_hpu()``, with Gaudi's DDP defaults and no ``device_ids``."""
    return distributed.collective_setup(device, launch)


@hookimpl
def devplug_dataloader(device: Device, source: Any, options: LoaderOptions) -> LoaderChoice:
    """``HabanaDataLoader`` for image folders when installed, else torch's loader; pinned memory by default."""
    from devplug.plugins.hpu import data  # the data pipeline: only when a loader is built

    return data.build_loader(device, source, options)


@hookimpl
def devplug_synchronize(device: Device) -> bool:
    """``torch.hpu.synchronize()``."""
    return stats.synchronize(device)


@hookimpl
def devplug_memory_stats(device: Device) -> MemoryStats:
    """Memory figures from ``torch.hpu``."""
    return stats.memory_stats(device)


@hookimpl
def devplug_compile_plan(device: Device) -> CompilePlan:
    """``hpu_backend`` in eager mode; none in lazy mode (it builds graphs itself)."""
    return mode.compile_plan(device)


@hookimpl
def devplug_compile(device: Device, module: torch.nn.Module, options: dict[str, Any]) -> torch.nn.Module:
    """``torch.compile(backend="hpu_backend")`` in eager mode; unchanged in lazy mode."""
    return mode.compile_module(device, module, options)


@hookimpl
def devplug_doctor() -> DoctorReport:
    """Gaudi stack versions, execution mode, PT_HPU_*/HCCL variables; lazy mode's drop_last pitfall."""
    return doctor.report()


@hookimpl
def devplug_peak_flops(device: Device, precision: str) -> PeakFlops | None:
    """Intel's published peak BF16 figure for Gaudi 1, 2 and 3 (`.peaks`); None for FP32 or another model."""
    name = getattr(probe.hpu_module(), "get_device_name", None)
    model = str(name()) if callable(name) else ""
    value = peaks.peak_flops(model, precision)
    return None if value is None else PeakFlops(value, "datasheet", f"{model}, {precision}")


@hookimpl
def devplug_sharding(device: Device, precision: str) -> ShardingPlan:
    """FSDP over HCCL in eager mode (with or without torch.compile); refused in lazy mode, saying how to switch."""
    return sharding.sharding_plan(device, precision)
