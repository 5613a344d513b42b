"""Hook implementations of the CUDA plugin.

The core routes operational hooks here only when the resolved device is ``cuda``, so no hook asks
"is this my device?". ``device.channels_last`` (the Trainer option) gives channels_last modules, 4-D
batches and DALI output. Device options read (``Trainer(device_options={...})``):

- ``tf32`` (default True): TF32 matmuls and cuDNN convolutions on Ampere and newer.
- ``apex`` (default True): use NVIDIA apex's fused optimizers when apex is installed.
- ``profile`` (default False): NVTX ranges around forward, backward and optimizer step.
- ``dali`` (default True): DALI for image folders when DALI is installed.
- ``pin_memory`` (default: where the loader has worker processes): pin host batches of the torch DataLoader
  when the author did not say; True or False here applies to every loader.
- ``cuda_graphs`` (default False): ``torch.compile(mode="reduce-overhead")`` (CUDA graphs) when compiling.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import attrs
import torch

from devplug import (
    CONTRACT_VERSION,
    CollectiveSetup,
    CompilePlan,
    ConfigError,
    Device,
    DeviceSpec,
    DevplugError,
    DoctorReport,
    ImageFolderSource,
    LaunchInfo,
    LoaderChoice,
    LoaderOptions,
    MemoryStats,
    OptimizerChoice,
    PeakFlops,
    Phase,
    PrecisionPlan,
    ShardingPlan,
    StepMarks,
    hookimpl,
)
from devplug.plugins.cuda import doctor, peaks
from devplug.plugins.cuda.precision import configure_tf32, plan_precision
from devplug.plugins.cuda.probe import compute_capability, device_count, probe
from devplug.toolkit import TORCH_OPTIMIZERS, log_once, move_to, torch_sharding_plan

#: The contract these hooks implement: a built-in always speaks the contract of the devplug it ships in.
DEVPLUG_CONTRACT = CONTRACT_VERSION

log = logging.getLogger("devplug")

@hookimpl
def devplug_register_devices() -> DeviceSpec:
    """NVIDIA GPUs through CUDA; available when torch sees a GPU, else the reason why not."""
    return DeviceSpec(
        name="cuda",
        description="NVIDIA GPU (CUDA): apex/torch fused optimizers, AMP fp16/bf16 with TF32, NCCL, DALI",
        priority=50,
        probe=probe,
        count=device_count,
    )


@hookimpl
def devplug_device_setup(device: Device) -> None:
    """Select the GPU (``torch.cuda.set_device``) and turn TF32 on (Ampere+) unless ``tf32=False``."""
    if device.index is not None:
        torch.cuda.set_device(device.index)
    index = torch.cuda.current_device()
    capability = compute_capability(index)
    tf32 = configure_tf32(bool(device.options.get("tf32", True)), capability)
    log.info("cuda:%d is %s (compute capability %d.%d); %s", index, torch.cuda.get_device_name(index),
             *capability, tf32)


@hookimpl
def devplug_to_device(device: Device, obj: Any) -> Any:
    """``.to("cuda")``, non-blocking from host memory, pinned or not; channels_last when the Trainer asks.

    A copy from pageable memory is staged by CUDA before the call returns, so it is safe without waiting
    (PyTorch's guide "A guide on good usage of non_blocking and pin_memory()"), and waiting would hold the host
    until the GPU has run all the work queued before it.
    """
    return move_to(obj, device.torch_device, memory_format=device.memory_format, async_from_host=True)


@hookimpl
def devplug_optimizer(device: Device, name: str, params: Any, options: dict[str, Any]) -> OptimizerChoice | None:
    """apex FusedAdam/FusedSGD/FusedLAMB when NVIDIA apex is there, else torch fused, else foreach.

    Names neither apex nor ``torch.optim`` provide are left to other plugins (``None``).
    """
    if name.lower() not in TORCH_OPTIMIZERS:
        return None
    from devplug.plugins.cuda.optimizers import build_optimizer  # apex is looked for when an optimizer is built

    return build_optimizer(name, params, options, use_apex=bool(device.options.get("apex", True)))


@hookimpl
def devplug_precision(device: Device, precision: str, strategy: str) -> PrecisionPlan:
    """fp16 autocast + GradScaler("cuda"), bf16 autocast, fp32, or fp8 (weights gathered in fp8 only when
    ``strategy`` shards them with FSDP); ``auto`` → bf16 where native."""
    return plan_precision(device, precision, strategy=strategy)


@hookimpl
def devplug_region(device: Device, name: str) -> Any:
    """An NVTX range named ``name`` when the device option ``profile`` is on; no marking otherwise."""
    if device.options.get("profile"):
        return torch.cuda.nvtx.range(name)
    return contextlib.nullcontext()


@hookimpl
def devplug_mark_step(device: Device, phase: Phase) -> None:
    """Nothing: CUDA executes eagerly (ranges for profilers come from ``devplug_region``)."""


@hookimpl
def devplug_step_marks(device: Device) -> StepMarks:
    """NVTX ranges only with the device option ``profile``; never a step mark: the step calls neither hook."""
    return StepMarks(regions=bool(device.options.get("profile")), steps=False)


def local_device_index(device: Device, launch: LaunchInfo) -> int:
    """The GPU this process drives: an explicit ``cuda:N``, else the launcher's local rank.

    When each process sees fewer GPUs than the local rank (a launcher that sets
    ``CUDA_VISIBLE_DEVICES`` per process), the local rank is folded onto the visible ones. An explicit
    ``cuda:N`` for several processes of a node that each see its GPUs is refused in one line: they would all
    drive GPU ``N``, which NCCL refuses with an error that names no flag.
    """
    count = device_count()
    if device.index is not None:
        if launch.local_world_size > 1 and count >= launch.local_world_size:
            raise ConfigError(
                f"device 'cuda:{device.index}' names one GPU for all {launch.local_world_size} processes on this "
                f"node, which share its {count} GPUs: each process needs a GPU of its own; give device='cuda' "
                "(each process then drives the GPU of its local rank)")
        return device.index
    return launch.local_rank % count if 0 < count <= launch.local_rank else launch.local_rank


@hookimpl
def devplug_collective_setup(device: Device, launch: LaunchInfo) -> CollectiveSetup:
    """nccl; ``torch.cuda.set_device(local_rank)``; DDP ``device_ids=[local_rank]``."""
    index = local_device_index(device, launch)
    torch.cuda.set_device(index)
    return CollectiveSetup(backend="nccl", ddp_kwargs={"device_ids": [index], "output_device": index})


@hookimpl
def devplug_dataloader(device: Device, source: Any, options: LoaderOptions) -> LoaderChoice:
    """DALI for image folders when DALI is installed, else the torch DataLoader, pinning host memory where it has
    worker processes (pinned on the loader's own thread; without workers, batches are copied from pageable
    memory, non-blocking, as `devplug_to_device` does).

    The torch DataLoader's workers, where the author left them out, are tuned by measuring the source
    (compute runs on the GPU, so workers do not compete with it); DALI's threads follow ``num_workers``.
    """
    from devplug.plugins.cuda import dali  # the data pipeline: only when a loader is built
    from devplug.toolkit import torch_dataloader

    chosen_here = options.pin_memory is None and device.options.get("pin_memory") is None
    if options.pin_memory is None:
        options = attrs.evolve(options, pin_memory=bool(device.options.get("pin_memory", True)))
    if not isinstance(source, ImageFolderSource):
        return torch_dataloader(source, options, compute_competes=False, pin_only_with_workers=chosen_here)
    if not device.options.get("dali", True):
        reason = "DALI disabled by the device option dali=False"
    else:
        reason = dali.dali_status()
        if not reason:
            device_id = device.index
            if device_id is None and torch.cuda.is_available():
                device_id = torch.cuda.current_device()
            try:
                return dali.build_dali_loader(source, options, device_id, channels_last=device.channels_last)
            except DevplugError:  # a missing or empty folder: the torch loader would say the same
                raise
            except Exception as exc:  # a DALI that imports but cannot run here must not stop training
                reason = f"the DALI pipeline could not be built ({type(exc).__name__}: {exc})"
    log_once(f"cuda: loading {source.root} with the torch DataLoader, not DALI: {reason}")
    return torch_dataloader(source, options, reason=reason, compute_competes=False, pin_only_with_workers=chosen_here)


@hookimpl
def devplug_synchronize(device: Device) -> bool:
    """``torch.cuda.synchronize`` on the device."""
    torch.cuda.synchronize(device.torch_device)
    return True


@hookimpl
def devplug_memory_stats(device: Device) -> MemoryStats:
    """Allocated, reserved and peak allocated bytes from the caching allocator, and the GPU's total."""
    where = device.torch_device
    return MemoryStats(
        allocated=torch.cuda.memory_allocated(where),
        reserved=torch.cuda.memory_reserved(where),
        peak_allocated=torch.cuda.max_memory_allocated(where),
        total=torch.cuda.get_device_properties(where).total_memory,
    )


@hookimpl
def devplug_compile_plan(device: Device) -> CompilePlan:
    """Inductor (Triton kernels); the device option ``cuda_graphs`` adds ``mode="reduce-overhead"``."""
    if device.options.get("cuda_graphs"):
        return CompilePlan(backend="inductor", options={"mode": "reduce-overhead"},
                           reason="Triton kernels, replayed as CUDA graphs (device option cuda_graphs)")
    return CompilePlan(backend="inductor", reason="Triton kernels")


@hookimpl
def devplug_compile(device: Device, module: torch.nn.Module, options: dict[str, Any]) -> Any:
    """``torch.compile``; the device option ``cuda_graphs`` selects ``mode="reduce-overhead"``."""
    options = dict(options)
    if device.options.get("cuda_graphs") and "mode" not in options:
        options["mode"] = "reduce-overhead"
    return torch.compile(module, **options)


@hookimpl
def devplug_doctor() -> DoctorReport:
    """apex and DALI versions, CUDA/NCCL variables, a DALI wheel for another CUDA major, PyPI's apex."""
    return doctor.report()


@hookimpl
def devplug_peak_flops(device: Device, precision: str) -> PeakFlops | None:
    """Dense peak of this GPU model for the plan's number format, from NVIDIA's datasheets (`.peaks`)."""
    name = torch.cuda.get_device_name(device.index or 0)
    row = peaks.peak_row(name, precision)
    return None if row is None else PeakFlops(row[2], "datasheet", peaks.peak_detail(name, row[0], row[1]))


@hookimpl
def devplug_sharding(device: Device, precision: str) -> ShardingPlan:
    """FSDP over NCCL: bf16 or fp16 gathers with fp32 reduce-scatters, CPU offload, torch's fused kernel.

    torch's fused Adam/AdamW/SGD CUDA kernels run over DTensor parameters (apex's do not: they are not
    used under FSDP). ``Trainer(device_options={"cpu_offload": True})`` keeps shards in pinned host memory.
    """
    return torch_sharding_plan(device, precision, optimizer_kernel="fused", cpu_offload=True, gather_low_precision=True,
                               optimizer_reason="torch.optim's fused CUDA kernel runs over DTensor shards; "
                                                "apex optimizers do not take DTensors")
