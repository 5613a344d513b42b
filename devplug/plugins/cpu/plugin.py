"""Hook implementations of the CPU plugin."""

from __future__ import annotations

import functools
import logging
import platform
from pathlib import Path
from typing import Any

import torch

from devplug import (
    CONTRACT_VERSION,
    Availability,
    CollectiveSetup,
    Device,
    DeviceSpec,
    LaunchInfo,
    LoaderChoice,
    LoaderOptions,
    MemoryStats,
    OptimizerChoice,
    PeakFlops,
    PrecisionPlan,
    ShardingPlan,
    hookimpl,
)
from devplug.plugins.cpu import peaks
from devplug.toolkit import (
    find_precision,
    float8_conversion,
    fp8_plan,
    fp8_skip_names,
    fp8_unavailable,
    groups_kept_on_failure,
    log_once,
    precision_plan,
    process_memory_stats,
    torch_optimizer_class,
    torch_sharding_plan,
)

#: The contract these hooks implement: a built-in always speaks the contract of the devplug it ships in.
DEVPLUG_CONTRACT = CONTRACT_VERSION

#: Optimizers that torch implements with a fused CPU kernel in recent releases.
FUSED_CANDIDATES = ("adam", "adamw", "sgd", "adagrad")


@hookimpl
def devplug_register_devices() -> DeviceSpec:
    """The host CPU: always available, lowest built-in priority."""
    return DeviceSpec(
        name="cpu",
        description="host CPU (PyTorch eager, fused optimizers, bf16 autocast on CPUs with native bf16)",
        priority=0,
        probe=Availability.yes,
        count=lambda: 1,
        # measured with benchmarks/cpu_levers.py: 1.18-1.25x on the DCGAN step, from its first step
        prefers_channels_last="oneDNN runs convolutions in NHWC without reordering every input and output",
    )


@functools.cache
def supports_fused(name: str) -> bool:
    """True when the installed torch builds ``name`` with ``fused=True`` for CPU parameters."""
    if name not in FUSED_CANDIDATES:
        return False
    param = torch.nn.Parameter(torch.zeros(1))
    try:
        # a torch.optim subclass: its constructor takes the options Optimizer's own signature lacks
        torch_optimizer_class(name)([param], lr=0.1, fused=True)  # type: ignore[call-arg]
    except (RuntimeError, ValueError, TypeError):
        return False
    return True


@hookimpl
def devplug_optimizer(device: Device, name: str, params: Any, options: dict[str, Any]) -> OptimizerChoice | None:
    """torch's fused CPU kernel where available and it takes the author's options, else the default implementation.

    An option the fused kernel refuses (``differentiable=True``) or torch refuses altogether is left to the
    core's default implementation, which builds the unfused kernel and says why, or names the author's option.
    """
    key = name.lower()
    if "fused" in options or "foreach" in options or not supports_fused(key):
        return None
    cls = torch_optimizer_class(key)
    params = list(params)
    try:
        with groups_kept_on_failure(params):  # a refused attempt leaves the author's groups for the next one
            # a torch.optim subclass: its constructor takes the options Optimizer's own signature lacks
            optimizer = cls(params, fused=True, **options)  # type: ignore[call-arg]
    except (RuntimeError, ValueError, TypeError):
        return None
    return OptimizerChoice(optimizer, f"torch.optim.{cls.__name__}(fused=True)")


@functools.cache
def cpu_flags() -> frozenset[str]:
    """CPU feature flags from /proc/cpuinfo (empty where it does not exist)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    flags: set[str] = set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            flags.update(value.split())
    return frozenset(flags)


def has_native_bf16() -> bool:
    """True when the CPU computes bf16 natively (x86 AMX or AVX512-BF16, Arm BF16)."""
    flags = cpu_flags()
    if flags & {"amx_bf16", "avx512_bf16"}:
        return True
    return platform.machine().lower() in ("aarch64", "arm64") and "bf16" in flags


def has_native_fp16() -> bool:
    """True when the CPU computes fp16 natively (x86 AMX-FP16 or AVX512-FP16, Arm half-precision arithmetic)."""
    flags = cpu_flags()
    if flags & {"amx_fp16", "avx512_fp16"}:
        return True
    return platform.machine().lower() in ("aarch64", "arm64") and bool(flags & {"fphp", "asimdhp"})


#: The number format each reduced compute dtype is, and the CPU features that compute it natively.
FORMATS = {torch.bfloat16: ("bf16", "AMX-BF16 or AVX512-BF16 on x86, BF16 on Arm"),
           torch.float16: ("fp16", "AMX-FP16 or AVX512-FP16 on x86, FP16 arithmetic on Arm")}


def compute_dtype(precision: str) -> torch.dtype:
    """The dtype ``precision`` computes in (float32 for a name no precision is registered under)."""
    known = find_precision(precision)
    return known.compute_dtype if known is not None else torch.float32


def warn_if_emulated(precision: str) -> None:
    """Warn once when ``precision`` computes in a format this CPU lacks (torch emulates it, slower than fp32).

    Says nothing where the CPU's features cannot be read (no ``/proc/cpuinfo``).
    """
    dtype = compute_dtype(precision)
    if dtype not in FORMATS or not cpu_flags():
        return
    number_format, features = FORMATS[dtype]
    if has_native_bf16() if number_format == "bf16" else has_native_fp16():
        return
    log_once(f"precision={precision!r}: this CPU has no native {number_format} arithmetic ({features}), so "
             "torch emulates it: expect training at least 2-3x slower than with precision='32-true'; "
             "precision='auto' picks the fastest this CPU computes", logging.WARNING)


def fp8_on_cpu(device: Device) -> PrecisionPlan:
    """CPUs have no fp8 matrix units: refused, unless ``device_options={"fp8": "emulate"}`` asks for torchao's
    emulation (the whole fp8 path run in higher precision, to test a model or a plugin here, never faster).

    ``fp8_skip`` (layer names kept in bfloat16, as on the GPU) is honoured; every other linear layer is converted.
    """
    if device.options.get("fp8") != "emulate":
        raise fp8_unavailable("this CPU", "device_options={'fp8': 'emulate'} runs it emulated, to test a model")
    convert = float8_conversion(recipe="tensorwise", emulate=True, fp8_all_gather=False, small_layers=True,
                                skip=fp8_skip_names(device.options.get("fp8_skip")))
    return fp8_plan(device, convert, "torchao float8 training, emulated on the CPU (tensorwise scaling; "
                                    "device option fp8='emulate'), bfloat16 autocast elsewhere")


@hookimpl
def devplug_precision(device: Device, precision: str) -> PrecisionPlan:
    """``auto`` → bf16-mixed on CPUs with native bf16, else 32-true; any registered precision as it plans itself.

    A setting that computes in bf16 or fp16 on a CPU without that format in hardware warns once: it runs
    emulated, slower than fp32.
    """
    if precision == "fp8-mixed":
        return fp8_on_cpu(device)
    if precision != "auto":
        warn_if_emulated(precision)
        return precision_plan(device, precision)
    native = has_native_bf16()
    why = ("this CPU computes bf16 natively (AMX, AVX512-BF16 or Arm BF16)" if native else
           "this CPU has no native bf16 arithmetic, so bf16 would be emulated, slower than fp32")
    return precision_plan(device, "bf16-mixed" if native else "32-true", notes=[f"auto: {why}"])


@hookimpl
def devplug_collective_setup(device: Device, launch: LaunchInfo) -> CollectiveSetup:
    """gloo; DDP keeps its own defaults on CPU."""
    return CollectiveSetup(backend="gloo")


@hookimpl
def devplug_dataloader(device: Device, source: Any, options: LoaderOptions) -> LoaderChoice:
    """The torch DataLoader, tuned for a device whose compute shares the cores with loading.

    A cheap source (a memory-mapped cache, tensors in memory) is read in the main process; an expensive
    one (decoding) by background workers that take only the CPU time the step leaves idle. The author's
    ``num_workers`` wins (see ``devplug.toolkit.tune_loader``).
    """
    from devplug.toolkit import torch_dataloader  # the data pipeline: only when a loader is built

    return torch_dataloader(source, options, compute_competes=True)


@hookimpl
def devplug_memory_stats(device: Device) -> MemoryStats:
    """Resident memory of this process (peak as reported by the OS)."""
    return process_memory_stats()


@hookimpl
def devplug_peak_flops(device: Device, precision: str) -> PeakFlops:
    """Computed from the CPU's features and clock (`.peaks`); where it cannot be, measured once per machine."""
    return peaks.peak_flops(compute_dtype(precision))


@hookimpl
def devplug_sharding(device: Device, precision: str) -> ShardingPlan:
    """FSDP over gloo: parameters travel in fp32 (autocast computes in bf16), the foreach kernel over DTensors.

    gloo's reductions in bf16 are slow and it has none in fp16, so gathers and reduce-scatters stay fp32;
    torch's fused CPU kernels are not used over sharded parameters (foreach is). Host memory holds
    everything already, so CPU offload has nothing to offer.
    """
    return torch_sharding_plan(device, precision, gather_low_precision=False, cpu_offload=False,
                               optimizer_reason="torch.optim's foreach kernel over DTensor shards; "
                                                "the fused CPU kernels are left to unsharded runs")
