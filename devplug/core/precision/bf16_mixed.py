"""``"bf16-mixed"``: bfloat16 autocast, no grad scaler (bfloat16 keeps float32's exponent range)."""

from __future__ import annotations

import torch

from devplug.core.precision.autocast import AutocastPrecision

PRECISION = AutocastPrecision(
    name="bf16-mixed",
    compute_dtype=torch.bfloat16,
    needs_scaler=False,
    scaler_reason="bfloat16 keeps float32's exponent range, so gradients do not underflow",
    summary="bfloat16 autocast",
)
