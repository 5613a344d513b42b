"""Waiting for the card and reading its memory, through ``torch.hpu`` (``habana_frameworks.torch.hpu``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from devplug import Device, MemoryStats
from devplug.plugins.hpu.probe import hpu_module


def synchronize(device: Device) -> bool:
    """``torch.hpu.synchronize()``: wait for all queued work on the card."""
    hpu_module().synchronize()
    return True


def _ask(function: Callable[[Any], Any] | None, index: int | None) -> Any:
    if function is None:
        return None
    try:
        return function(index)
    except Exception:  # a statistic the release does not provide is reported as unknown
        return None


def memory_stats(device: Device) -> MemoryStats:
    """Allocated, peak and reserved bytes and the card's total, as ``torch.hpu`` reports them."""
    hpu = hpu_module()
    allocated = _ask(getattr(hpu, "memory_allocated", None), device.index)
    peak = _ask(getattr(hpu, "max_memory_allocated", None), device.index)
    reserved = _ask(getattr(hpu, "memory_reserved", None), device.index)
    info = _ask(getattr(hpu, "mem_get_info", None), device.index)
    return MemoryStats(
        allocated=None if allocated is None else int(allocated),
        reserved=None if reserved is None else int(reserved),
        peak_allocated=None if peak is None else int(peak),
        total=None if info is None else int(info[1]),
    )
