"""A toy precision for the precision layer's tests, written the way a new precision is: one module.

``"toy-scaled-32"`` computes in float32 but scales the loss with a grad scaler, as a low-precision format
would: a scaled fake whose training must equal plain fp32 step for step (scaling by a power of two and
unscaling is exact in float32), so the test sees the whole plan at work without low-precision noise.
It uses only the public API (``devplug``, ``devplug.toolkit``).
"""

from __future__ import annotations

import torch

import devplug
from devplug.toolkit import Precision, PrecisionParams


class ToyScaled32(Precision):
    """float32 compute with a ``torch.amp.GradScaler`` for the device type."""

    name = "toy-scaled-32"
    compute_dtype = torch.float32
    needs_scaler = True
    scaler_reason = "it stands for a format whose gradients underflow without loss scaling"
    summary = "fp32 with a grad scaler (a toy)"

    def plan(self, params: PrecisionParams) -> devplug.PrecisionPlan:
        scaler = torch.amp.GradScaler(params.device_type) if self.use_scaler(params) else None
        return devplug.PrecisionPlan(name=self.name, scaler=scaler, description=self.describe(self.summary, params),
                                     no_scaler_reason=params.no_scaler_reason if scaler is None else "")


PRECISION = ToyScaled32()
