"""Hook implementations of the generic plugin.

It declares every device type torch knows (see `.catalog`) as a ``generic`` device, so each is
served here only while no other plugin declares it: ``mps``, ``xpu``, ``mtia`` and a renamed PrivateUse1
backend such as ``npu`` out of the box, and ``cuda``, ``hpu`` or ``cpu`` once their dedicated plugin is
blocked (``DEVPLUG_BLOCK_PLUGINS=cuda`` trains on a GPU through torch's generic paths, the baseline
of the cuda plugin's benchmarks). Everything else comes from the core fallback, which is
device-generic: ``torch.accelerator`` synchronize and memory statistics, device RNG states,
``Backend.default_device_backend_map``, autocast where torch has it, fused or foreach optimizers.
This plugin adds what PyTorch documents per type: pinned host memory for the data loader except on
MPS.
"""

from __future__ import annotations

import functools
from typing import Any

import attrs

from devplug import CONTRACT_VERSION, Device, DeviceSpec, LoaderChoice, LoaderOptions, ShardingPlan, hookimpl
from devplug.plugins.generic.catalog import declared_types, facts, priority
from devplug.plugins.generic.probe import count, probe
from devplug.toolkit import log_once, torch_dataloader, torch_sharding_plan

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


@hookimpl
def devplug_dataloader(device: Device, source: Any, options: LoaderOptions) -> LoaderChoice:
    """The torch DataLoader, pinning host memory by default where PyTorch supports it for the type (not MPS).

    Workers the author left out are tuned by measuring the source; compute runs on the accelerator.
    """
    if options.pin_memory is None:
        options = attrs.evolve(options, pin_memory=facts(device.torch_device.type).pin_memory)
    return torch_dataloader(source, options, compute_competes=False)


@hookimpl
def devplug_sharding(device: Device, precision: str) -> ShardingPlan:
    """FSDP over torch's collective backend for the type (``xccl`` for XPU); refused, saying so, where torch has
    none (MPS): one process without sharding is the alternative there."""
    return torch_sharding_plan(device, precision)
