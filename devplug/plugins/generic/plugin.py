"""Hook implementations of the generic plugin.

It declares every device type torch knows (see `.catalog`) as a ``generic`` device, so each is
served here only while no other plugin declares it: ``mps``, ``xpu``, ``mtia`` and a renamed PrivateUse1
backend such as ``npu`` out of the box, and ``cuda``, ``hpu`` or ``cpu`` once their dedicated plugin is
blocked (``DEVPLUG_BLOCK_PLUGINS=cuda`` trains on a GPU through torch's generic paths, the baseline
of the cuda plugin's benchmarks). Everything else comes from the core fallback, which is
device-generic: ``torch.accelerator`` synchronize and memory statistics, device RNG states,
``Backend.default_device_backend_map``, autocast where torch has it, fused or foreach optimizers.
This plugin adds what PyTorch documents per type: pinned host memory for the data loader except on
MPS. An out-of-tree backend is tried before it is trusted (`.trial`): it is available only if a tiny
training step ran on it, and its loaders pin memory and its precision plans use autocast only where those
worked.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import attrs

from devplug import (
    CONTRACT_VERSION,
    ConfigError,
    Device,
    DeviceSpec,
    LoaderChoice,
    LoaderOptions,
    PrecisionError,
    PrecisionPlan,
    ShardingPlan,
    hookimpl,
)
from devplug.plugins.generic.catalog import declared_types, facts, priority, privateuse1_name
from devplug.plugins.generic.probe import count, probe
from devplug.toolkit import log_once, probe_time_limit, torch_precision_plan, torch_sharding_plan

if TYPE_CHECKING:
    from devplug.plugins.generic.trial import Trial

#: The contract these hooks implement: a built-in always speaks the contract of the devplug it ships in.
DEVPLUG_CONTRACT = CONTRACT_VERSION


def device_spec(device_type: str) -> DeviceSpec:
    """The generic declaration of ``device_type``: its probe, count and priority, served by torch's generic API."""
    about = facts(device_type)
    return DeviceSpec(
        name=device_type,
        description=f"{about.label} through PyTorch's generic API (torch.accelerator, torch.amp, fused optimizers); "
                    f"a dedicated plugin for {device_type!r} takes precedence",
        priority=priority(device_type),
        probe=functools.partial(probe, device_type),
        count=functools.partial(count, device_type),
        generic=True,
    )


@hookimpl
def devplug_register_devices() -> list[DeviceSpec]:
    """Every device type the installed torch knows, each served only while no other plugin declares it."""
    return [device_spec(device_type) for device_type in declared_types()]


@hookimpl
def devplug_device_setup(device: Device) -> None:
    """Say once that the device runs on torch's generic path (the fallback selects ``NAME:INDEX``)."""
    log_once(f"{device.name}: served by the generic plugin through PyTorch's device-generic API "
             "(no dedicated plugin for this device type is loaded)")


def tried(device: Device) -> Trial | None:
    """The trial of an out-of-tree backend (`.trial`); ``None`` for the device types torch itself supports."""
    from devplug.plugins.generic.trial import trial  # only an out-of-tree backend is tried

    kind = device.torch_device.type
    return trial(kind, probe_time_limit() * 0.9) if kind == privateuse1_name() else None


@hookimpl
def devplug_dataloader(device: Device, source: Any, options: LoaderOptions) -> LoaderChoice:
    """The torch DataLoader, pinning host memory by default where PyTorch supports it for the type (not MPS)
    and, on an out-of-tree backend, where pinning worked when the backend was tried; pinned only where the
    loader has worker processes (without them torch would pin each batch in the main process).

    Workers the author left out are tuned by measuring the source; compute runs on the accelerator.
    """
    attempt = tried(device)
    chosen_here = options.pin_memory is None
    if chosen_here:
        pin = facts(device.torch_device.type).pin_memory and (attempt is None or attempt.ok("pin_memory"))
        options = attrs.evolve(options, pin_memory=pin)
    elif options.pin_memory and attempt is not None and not attempt.ok("pin_memory"):
        raise ConfigError(
            f"{attempt.who()} cannot pin host memory ({attempt.problem('pin_memory')}); "
            "load without pinned memory (pin_memory=False)")
    from devplug.toolkit import torch_dataloader  # the data pipeline: only when a loader is built

    return torch_dataloader(source, options, compute_competes=False, pin_only_with_workers=chosen_here)


@hookimpl
def devplug_precision(device: Device, precision: str) -> PrecisionPlan | None:
    """On an out-of-tree backend, mixed precision only where its autocast ran when tried; ``"auto"`` picks
    bf16 only then. Other device types: the core fallback's plan (this hook answers nothing)."""
    attempt = tried(device)
    if attempt is None:
        return None
    if precision == "auto":
        plan = torch_precision_plan(device, "auto")
        if plan.name != "32-true" and not attempt.ok("autocast[bfloat16]"):
            plan = torch_precision_plan(device, "32-true")
            return attrs.evolve(plan, description=f"{plan.description} (auto: torch.autocast failed on "
                                                  f"{attempt.who()}: {attempt.problem('autocast[bfloat16]')})")
        return plan
    item = {"16-mixed": "autocast[float16]", "bf16-mixed": "autocast[bfloat16]"}.get(precision)
    if item is not None and not attempt.ok(item):
        raise PrecisionError(f"precision {precision!r} cannot run on {attempt.who()}: torch.autocast failed when "
                             f"tried ({attempt.problem(item)}); use precision='32-true'")
    return torch_precision_plan(device, precision)


@hookimpl
def devplug_sharding(device: Device, precision: str) -> ShardingPlan:
    """FSDP over torch's collective backend for the type (``xccl`` for XPU); refused, saying so, where torch has
    none (MPS): one process without sharding is the alternative there."""
    return torch_sharding_plan(device, precision)
