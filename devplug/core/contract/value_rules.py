"""Rules on the values of hook answers that their type alone does not state; the guard applies them where the
core receives each answer (`devplug.core.registry.answers`)."""

from __future__ import annotations

import math
import numbers
from typing import Any

import attrs

from devplug.core.contract.records import MemoryStats, PeakFlops


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


def memory_figure_problem(stats: MemoryStats) -> tuple[str, Any] | None:
    """The first figure of ``stats`` that is not a number of bytes, as ``(field name, value)``; ``None`` when every
    one is a whole, non-negative ``int`` or ``None`` (not reported), as a report must show them."""
    for field in attrs.fields(MemoryStats):
        value = getattr(stats, field.name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            return field.name, value
    return None
