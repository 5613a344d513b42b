"""A device plugin's answer to ``devplug_peak_flops``, checked before it reaches MFU.

The hook may answer a `PeakFlops` (value and source) or, as before
contract 1.4, a plain float (source ``"plugin"``). A figure that is not a positive finite number cannot
give an MFU: it is dropped with one warning naming the plugin, and MFU is then not reported.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from devplug.core.contract.records import PeakFlops
from devplug.core.log_once import log_once


def checked_peak(answer: Any, plugin: str) -> PeakFlops | None:
    """``answer`` as a `PeakFlops`, or ``None`` when it is absent or unusable (then warned once)."""
    if answer is None:
        return None
    peak = answer if isinstance(answer, PeakFlops) else None
    value = peak.value if peak is not None else answer
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        log_once(f"devplug_peak_flops of plugin {plugin!r} answered {answer!r}, not a positive finite FLOP/s "
                 "figure: ignored, MFU not reported", logging.WARNING)
        return None
    return peak if peak is not None else PeakFlops(float(value), "plugin")
