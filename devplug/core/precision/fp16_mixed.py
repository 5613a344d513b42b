"""``"16-mixed"``: float16 autocast with a grad scaler (fp16's narrow exponent range flushes small gradients)."""

from __future__ import annotations

import torch

from devplug.core.precision.autocast import AutocastPrecision
from devplug.core.precision.base import FLOAT16_PRECISION

PRECISION = AutocastPrecision(
    name=FLOAT16_PRECISION,
    compute_dtype=torch.float16,
    needs_scaler=True,
    scaler_reason="float16's narrow exponent range flushes small gradients to zero unless the loss is scaled",
    summary="float16 autocast with a grad scaler",
)
