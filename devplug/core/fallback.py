"""The core's fallback plugin: plain, device-neutral PyTorch for every first-result hook.

Registered before all others and marked ``trylast``, so any device or neutral plugin that answers
a hook takes precedence. It lets a third-party device plugin implement only what differs.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from devplug.core.data import torch_dataloader
from devplug.core.hookimpl import hookimpl
from devplug.core.recipes import autocast_plan, torch_optimizer_class
from devplug.core.records import (
    CollectiveSetup,
    Device,
    LaunchInfo,
    LoaderChoice,
    LoaderOptions,
    OptimizerChoice,
    PrecisionPlan,
)
from devplug.core.tree import move_to


@hookimpl(trylast=True)
def devplug_to_device(device: Device, obj: Any) -> Any:
    """Plain ``.to(device)``; non-blocking copies from pinned memory; channels_last when the Trainer asks."""
    return move_to(obj, device.torch_device, memory_format=device.memory_format)


@hookimpl(trylast=True)
def devplug_optimizer(device: Device, name: str, params: Any, options: dict[str, Any]) -> OptimizerChoice:
    """The default ``torch.optim`` implementation."""
    cls = torch_optimizer_class(name)
    return OptimizerChoice(cls(params, **options), f"torch.optim.{cls.__name__}")


@hookimpl(trylast=True)
def devplug_precision(device: Device, precision: str) -> PrecisionPlan:
    """``"auto"`` means fp32 for a device whose plugin says nothing; the rest through torch.autocast."""
    return autocast_plan(device, "32-true" if precision == "auto" else precision)


@hookimpl(trylast=True)
def devplug_region(device: Device, name: str) -> Any:
    """No region marking."""
    return contextlib.nullcontext()


@hookimpl(trylast=True)
def devplug_clip_grad_norm(
    device: Device, parameters: list[torch.Tensor], max_norm: float, norm_type: float
) -> torch.Tensor:
    """``torch.nn.utils.clip_grad_norm_`` (its multi-tensor ``foreach`` kernels where torch has them for the device)."""
    return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)


@hookimpl(trylast=True)
def devplug_collective_setup(device: Device, launch: LaunchInfo) -> CollectiveSetup:
    """gloo, the backend that runs everywhere."""
    return CollectiveSetup(backend="gloo")


@hookimpl(trylast=True)
def devplug_dataloader(device: Device, source: Any, options: LoaderOptions) -> LoaderChoice:
    """A tuned ``torch.utils.data.DataLoader``."""
    return torch_dataloader(source, options)


@hookimpl(trylast=True)
def devplug_synchronize(device: Device) -> bool:
    """Nothing to wait for on a device whose plugin does not say otherwise."""
    return True


@hookimpl(trylast=True)
def devplug_compile(device: Device, module: torch.nn.Module, options: dict[str, Any]) -> Any:
    """``torch.compile`` with its default backend."""
    return torch.compile(module, **options)
