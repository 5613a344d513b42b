"""The shared builder of mixed precisions: ``torch.autocast`` in a dtype, and a ``torch.amp.GradScaler`` if needed."""

from __future__ import annotations

import attrs
import torch

from devplug.core.errors import PrecisionError
from devplug.core.precision.base import Precision, PrecisionParams, PrecisionPlan


class AutocastPrecision(Precision):
    """A mixed precision: weights and optimizer in fp32, forward and loss under ``torch.autocast(dtype)``."""

    def __init__(self, *, name: str, compute_dtype: torch.dtype, needs_scaler: bool, scaler_reason: str,
                 summary: str) -> None:
        self.name = name
        self.compute_dtype = compute_dtype
        self.needs_scaler = needs_scaler
        self.scaler_reason = scaler_reason
        self.summary = summary

    def plan(self, params: PrecisionParams) -> PrecisionPlan:
        """Autocast for ``params.device_type`` (unless the device casts by other means), a scaler if needed."""
        kind = params.device_type
        dtype = self.compute_dtype
        if params.autocast and not torch.amp.is_autocast_available(kind):
            raise PrecisionError(f"torch has no autocast for device type {kind!r}; use precision='32-true'")
        grad_scaler = torch.amp.GradScaler(kind) if self.use_scaler(params) else None
        text = f"torch.autocast({kind!r}, {str(dtype).replace('torch.', '')})" if params.autocast else self.summary
        if grad_scaler is not None:
            text += " + GradScaler"
        plan = PrecisionPlan(
            name=self.name,
            scaler=grad_scaler,
            convert_module=params.convert_module,
            optimizer_step_context=params.optimizer_step_context,
            description=self.describe(text, params),
            no_scaler_reason=params.no_scaler_reason if grad_scaler is None else "",
        )
        if not params.autocast:
            return plan
        return attrs.evolve(plan, autocast=lambda: torch.autocast(device_type=kind, dtype=dtype))
