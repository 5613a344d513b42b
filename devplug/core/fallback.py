"""The core's fallback plugin: plain, device-neutral PyTorch for every first-result hook.

Registered before all others and marked ``trylast``, so any device or neutral plugin that answers
a hook takes precedence. It lets a third-party device plugin implement only what differs.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from typing import Any

import torch

from devplug.core.data import torch_dataloader
from devplug.core.errors import OptimizerError, PrecisionError
from devplug.core.hookimpl import hookimpl
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

#: Standard optimizer names and their torch classes.
TORCH_OPTIMIZERS: dict[str, str] = {
    "adam": "Adam",
    "adamw": "AdamW",
    "sgd": "SGD",
    "rmsprop": "RMSprop",
    "adagrad": "Adagrad",
    "adamax": "Adamax",
    "nadam": "NAdam",
    "radam": "RAdam",
    "lamb": "",  # no torch implementation; plugins with apex provide it
}


def torch_optimizer_class(name: str) -> type[torch.optim.Optimizer]:
    """The ``torch.optim`` class for a standard optimizer name, or an :class:`OptimizerError`."""
    cls_name = TORCH_OPTIMIZERS.get(name.lower())
    if not cls_name:
        known = ", ".join(n for n, c in TORCH_OPTIMIZERS.items() if c)
        raise OptimizerError(f"unknown optimizer {name!r}; torch provides: {known}")
    return getattr(torch.optim, cls_name)


@functools.cache
def torch_optimizer_defaults(cls: type[torch.optim.Optimizer]) -> dict[str, Any]:
    """The keyword defaults of a torch optimizer's constructor, e.g. ``{"lr": 0.001, "betas": ...}``.

    Plugins mapping an author's options onto a vendor optimizer start from these, so an option the author
    left out behaves as it would in ``torch.optim``.
    """
    return {
        name: p.default
        for name, p in inspect.signature(cls).parameters.items()
        if p.default is not inspect.Parameter.empty
    }


@hookimpl(trylast=True)
def devplug_to_device(device: Device, obj: Any) -> Any:
    """Plain ``.to(device)``; non-blocking copies from pinned memory."""
    return move_to(obj, device.torch_device)


@hookimpl(trylast=True)
def devplug_optimizer(device: Device, name: str, params: Any, options: dict[str, Any]) -> OptimizerChoice:
    """The default ``torch.optim`` implementation."""
    cls = torch_optimizer_class(name)
    return OptimizerChoice(cls(params, **options), f"torch.optim.{cls.__name__}")


def autocast_plan(device: Device, precision: str, *, scaler: bool | None = None) -> PrecisionPlan:
    """A precision plan built only from ``torch.autocast`` and ``torch.amp.GradScaler``.

    ``"16-mixed"`` gets a grad scaler unless ``scaler=False``; ``"bf16-mixed"`` none.
    """
    kind = device.torch_device.type
    if precision == "32-true":
        return PrecisionPlan(name="32-true", description="full fp32")
    if precision not in ("16-mixed", "bf16-mixed"):
        raise PrecisionError(f"precision {precision!r} is not one of 32-true, 16-mixed, bf16-mixed, auto")
    dtype = torch.float16 if precision == "16-mixed" else torch.bfloat16
    if not torch.amp.is_autocast_available(kind):
        raise PrecisionError(f"torch has no autocast for device type {kind!r}; use precision='32-true'")
    use_scaler = (precision == "16-mixed") if scaler is None else scaler
    grad_scaler = torch.amp.GradScaler(kind) if use_scaler else None
    return PrecisionPlan(
        name=precision,
        autocast=lambda: torch.autocast(device_type=kind, dtype=dtype),
        scaler=grad_scaler,
        description=f"torch.autocast({kind!r}, {str(dtype).replace('torch.', '')})"
        + (" + GradScaler" if grad_scaler is not None else ""),
    )


@hookimpl(trylast=True)
def devplug_precision(device: Device, precision: str) -> PrecisionPlan:
    """``"auto"`` means fp32 for a device whose plugin says nothing; the rest through torch.autocast."""
    return autocast_plan(device, "32-true" if precision == "auto" else precision)


@hookimpl(trylast=True)
def devplug_region(device: Device, name: str) -> Any:
    """No region marking."""
    return contextlib.nullcontext()


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
