"""``"32-true"``: plain fp32 training, no autocast, no grad scaler (a device may still use TF32 matmuls)."""

from __future__ import annotations

import torch

from devplug.core.precision.base import Precision, PrecisionParams, PrecisionPlan


class Full32(Precision):
    """Everything in float32."""

    name = "32-true"
    compute_dtype = torch.float32
    needs_scaler = False
    scaler_reason = "fp32 gradients keep their small values"
    summary = "full fp32"

    def plan(self, params: PrecisionParams) -> PrecisionPlan:
        """A plan with no autocast and no scaler (the device's module conversion and step context kept)."""
        return PrecisionPlan(name=self.name, convert_module=params.convert_module,
                             optimizer_step_context=params.optimizer_step_context,
                             description=self.describe(self.summary, params))


PRECISION = Full32()
