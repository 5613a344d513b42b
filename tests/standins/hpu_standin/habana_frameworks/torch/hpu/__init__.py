"""Stand-in for ``habana_frameworks.torch.hpu`` (``torch.hpu`` once the bridge is loaded).

The device count comes from ``$HPU_STANDIN_DEVICES`` (default 1). Memory figures are fixed numbers.
"""

from __future__ import annotations

import os
from typing import Any

import hpu_standin_calls

_LIMIT = 96 * 2**30
_IN_USE = 3 * 2**20
_MAX_IN_USE = 5 * 2**20


def is_available() -> bool:
    """True when at least one Gaudi device is visible (HabanaAI/gaudi-pytorch-bridge 1.19,
    python_packages/habana_frameworks/torch/hpu/__init__.py line 99)."""
    return device_count() > 0


def device_count() -> int:
    """The number of visible Gaudi devices (hpu/__init__.py line 108)."""
    return int(os.environ.get("HPU_STANDIN_DEVICES", "1"))


def get_device_name(device: Any = None) -> str:
    """The card's name, e.g. ``"GAUDI2"`` (hpu/__init__.py lines 121-142); Intel's Transformer Engine refuses fp8
    when it is ``"GAUDI"`` (first generation). From ``$HPU_STANDIN_DEVICE_TYPE`` (default ``gaudi2``)."""
    return os.environ.get("HPU_STANDIN_DEVICE_TYPE", "gaudi2").upper()


def synchronize() -> None:
    """Wait for all queued work on the device (hpu/__init__.py line 151; stand-in: record the call)."""
    hpu_standin_calls.record("hpu.synchronize")


def memory_stats(device: Any = None) -> dict[str, int]:
    """The allocator's statistics: ``Limit``, ``InUse``, ``MaxInUse`` and counters (hpu/memory.py line 77)."""
    return {"Limit": _LIMIT, "InUse": _IN_USE, "MaxInUse": _MAX_IN_USE, "NumAllocs": 0, "NumFrees": 0}


def memory_allocated(device: Any = None) -> int:
    """Bytes currently allocated by tensors (hpu/memory.py line 44)."""
    return memory_stats(device)["InUse"]


def max_memory_allocated(device: Any = None) -> int:
    """Peak bytes allocated by tensors (hpu/memory.py line 32)."""
    return memory_stats(device)["MaxInUse"]


def memory_reserved(device: Any = None) -> int:
    """Bytes managed by the allocator (hpu/memory.py line 153; the bridge reports its limit)."""
    return memory_stats(device)["Limit"]


def mem_get_info(device: Any = None) -> tuple[int, int]:
    """(free, total) device memory in bytes (hpu/memory.py line 177)."""
    stats = memory_stats(device)
    return stats["Limit"] - stats["InUse"], stats["Limit"]
