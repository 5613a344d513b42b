"""Precision plans for any device type, built through the precision layer (public through devplug.toolkit).

`precision_plan` is how a device plugin asks a registered precision for its plan with the device's
parameters; `autocast_plan` is its short form; `torch_precision_plan` also resolves ``"auto"`` from what
torch reports for the device type.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from typing import Any

import attrs
import torch

from devplug.core.contract.records import Device, PrecisionPlan
from devplug.core.fallback import accelerator
from devplug.core.precision import registry
from devplug.core.precision.base import PrecisionParams


def precision_plan(device: Device, precision: str, *, scaler: bool | None = None, no_scaler_reason: str = "",
                   autocast: bool = True,
                   convert_module: Callable[[torch.nn.Module], torch.nn.Module] | None = None,
                   optimizer_step_context: Callable[[], contextlib.AbstractContextManager[Any]] | None = None,
                   description: str | None = None, notes: Iterable[str] = ()) -> PrecisionPlan:
    """The plan of the registered precision ``precision`` on ``device``, parameterised as a plugin says.

    ``precision`` must be resolved (not ``"auto"``); an unknown name is a one-line ``PrecisionError``
    listing the known ones. The keywords are `PrecisionParams`'s: ``scaler`` overrides whether the plan
    has a grad scaler (dropping one the precision needs takes ``no_scaler_reason``), ``autocast=False``
    for a device that casts by other means, ``convert_module`` / ``optimizer_step_context`` passed
    through, ``description`` to replace the precision's own, ``notes`` appended to it.
    """
    params = PrecisionParams(device_type=device.torch_device.type, scaler=scaler, no_scaler_reason=no_scaler_reason,
                             autocast=autocast, convert_module=convert_module,
                             optimizer_step_context=optimizer_step_context, description=description,
                             notes=tuple(notes))
    return registry.get(precision).plan(params)


def autocast_plan(device: Device, precision: str, *, scaler: bool | None = None,
                  no_scaler_reason: str = "") -> PrecisionPlan:
    """A precision plan built only from ``torch.autocast`` and ``torch.amp.GradScaler``.

    ``"16-mixed"`` gets a grad scaler unless ``scaler=False``, which needs ``no_scaler_reason`` (why the
    float16 plan can do without one, see `PrecisionPlan`); ``"bf16-mixed"`` none. Any registered
    precision is planned the same way (see `precision_plan`).
    """
    return precision_plan(device, precision, scaler=scaler, no_scaler_reason=no_scaler_reason)


def torch_precision_plan(device: Device, precision: str) -> PrecisionPlan:
    """`autocast_plan`, with ``"auto"`` resolved from what torch reports for the device type, and why.

    ``"auto"`` is ``"bf16-mixed"`` where torch has autocast for the type
    (``torch.amp.is_autocast_available``) and the type's module reports native bf16
    (``is_bf16_supported``), else ``"32-true"``; the plan's description says which and why.
    """
    if precision != registry.AUTO:
        return autocast_plan(device, precision)
    kind = device.torch_device.type
    if not torch.amp.is_autocast_available(kind):
        chosen, why = "32-true", f"torch has no autocast for device type {kind!r}"
    else:
        bf16, why = accelerator.native_bf16(kind)
        chosen = "bf16-mixed" if bf16 else "32-true"
    plan = autocast_plan(device, chosen)
    return attrs.evolve(plan, description=f"{plan.description} (auto: {why})")


def fp8_plan(device: Device, convert: Callable[[torch.nn.Module], torch.nn.Module],
             description: str, *,
             context: Callable[[], contextlib.AbstractContextManager[Any]] | None = None,
             uncompiled_note: str = "") -> PrecisionPlan:
    """The ``"fp8-mixed"`` plan: ``convert`` applied to each module, the rest of the model in bfloat16 autocast.

    ``context``: the device's own fp8 context, entered inside the bfloat16 autocast around forward and loss
    (Intel Gaudi's ``te.fp8_autocast(enabled=True, fp8_recipe=...)``); ``uncompiled_note``: what it costs not
    to compile the model (`PrecisionPlan.uncompiled_note`).
    """
    params = PrecisionParams(device_type=device.torch_device.type, convert_module=convert, forward_context=context,
                             description=description)
    plan = registry.get("fp8-mixed").plan(params)
    return attrs.evolve(plan, uncompiled_note=uncompiled_note) if uncompiled_note else plan
