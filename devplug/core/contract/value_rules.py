"""Rules on the values of hook answers that their type alone does not state; the guard applies them where the
core receives each answer (`devplug.core.registry.answers`)."""

from __future__ import annotations

import math
import numbers
from typing import Any

from devplug.core.contract.records import PeakFlops


def peak_flops_problem(value: Any) -> str:
    """Why ``value`` is not a peak FLOP/s figure (``""`` when it is one): a positive, finite number (or a
    `PeakFlops` holding one), or ``None``.

    ``None`` means "unknown"; zero, a negative figure, infinity, NaN or a ``bool`` would make MFU a lie.
    """
    if isinstance(value, PeakFlops):
        value = value.value
    if value is None:
        return ""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return f"{value!r} is not a number"
    if not math.isfinite(value) or value <= 0:
        return f"{value!r} is not a positive, finite number of FLOP/s"
    return ""
