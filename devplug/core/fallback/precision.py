"""Precision plans built from ``torch.autocast`` and ``torch.amp.GradScaler`` alone, for any device type.

``"auto"`` is resolved from what torch reports for the device type (public through devplug.toolkit).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs
import torch

from devplug.core.contract.records import Device, PrecisionPlan
from devplug.core.errors import PrecisionError
from devplug.core.fallback import accelerator
from devplug.core.precision.fp8_mixed import NAME as FP8
from devplug.core.precision.fp8_mixed import fp8_unavailable

if TYPE_CHECKING:
    from collections.abc import Callable


def autocast_plan(device: Device, precision: str, *, scaler: bool | None = None,
                  no_scaler_reason: str = "") -> PrecisionPlan:
    """A precision plan built only from ``torch.autocast`` and ``torch.amp.GradScaler``.

    ``"16-mixed"`` gets a grad scaler unless ``scaler=False``, which needs ``no_scaler_reason`` (why the
    float16 plan can do without one, see `PrecisionPlan`); ``"bf16-mixed"`` none.
    """
    kind = device.torch_device.type
    if precision == "32-true":
        return PrecisionPlan(name="32-true", description="full fp32")
    if precision == FP8:
        raise fp8_unavailable(f"device type {kind!r}")
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
        no_scaler_reason=no_scaler_reason if grad_scaler is None else "",
        description=f"torch.autocast({kind!r}, {str(dtype).replace('torch.', '')})"
        + (" + GradScaler" if grad_scaler is not None else ""),
    )


def torch_precision_plan(device: Device, precision: str) -> PrecisionPlan:
    """`autocast_plan`, with ``"auto"`` resolved from what torch reports for the device type, and why.

    ``"auto"`` is ``"bf16-mixed"`` where torch has autocast for the type
    (``torch.amp.is_autocast_available``) and the type's module reports native bf16
    (``is_bf16_supported``), else ``"32-true"``; the plan's description says which and why.
    """
    if precision != "auto":
        return autocast_plan(device, precision)
    kind = device.torch_device.type
    if not torch.amp.is_autocast_available(kind):
        chosen, why = "32-true", f"torch has no autocast for device type {kind!r}"
    else:
        bf16, why = accelerator.native_bf16(kind)
        chosen = "bf16-mixed" if bf16 else "32-true"
    plan = autocast_plan(device, chosen)
    return attrs.evolve(plan, description=f"{plan.description} (auto: {why})")


def fp8_plan(device_type: str, convert: Callable[[torch.nn.Module], torch.nn.Module],
             description: str) -> PrecisionPlan:
    """The ``"fp8-mixed"`` plan: ``convert`` applied to each module, the rest of the model in bfloat16 autocast."""
    return PrecisionPlan(name=FP8, autocast=lambda: torch.autocast(device_type=device_type, dtype=torch.bfloat16),
                         convert_module=convert, description=description)
