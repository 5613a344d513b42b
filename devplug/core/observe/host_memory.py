"""How much host memory a run may still take, and byte counts written for people."""

from __future__ import annotations

import contextlib
from pathlib import Path

from devplug.core.errors import ConfigError


def available_host_memory() -> int | None:
    """Bytes this process may still allocate: ``MemAvailable``, capped by a cgroup v2 limit; None if unknown.

    A script checks a model's size against it before building anything, so a model that cannot fit is one
    line, not an allocator's traceback.
    """
    available = None
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024
    with contextlib.suppress(OSError, ValueError):
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            room = int(limit) - int(Path("/sys/fs/cgroup/memory.current").read_text())
            available = room if available is None else min(available, room)
    return available


def human_bytes(nbytes: float) -> str:
    """``1.2 GB``-style size (powers of 1000, as ``df -H`` prints)."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if nbytes < 1000 or unit == "TB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1000
    raise AssertionError("unreachable")


def check_model_fits(*, build_bytes: int, train_bytes: int, model: str, batch: str, flags: str,
                     device_total: int | None, host_available: int | None,
                     contents: str = "weights, gradients, optimizer state, activations") -> None:
    """Raise one `devplug.ConfigError` line when a model cannot be built or trained in the memory there is.

    The model is built in host memory (``build_bytes``), then trained where the device plugin puts it:
    ``device_total`` bytes (`Trainer.memory_stats`'s ``total``), or host memory when the device reports none
    (``host_available``, e.g. `available_host_memory`). ``model`` describes it ("12,345 parameters (...)"),
    ``batch`` what one step trains on ("a batch of 64"), ``contents`` what ``train_bytes`` counts, and ``flags``
    names the options that make it smaller. Unknown sizes (None) are not checked.
    """
    if host_available is not None and build_bytes > host_available:
        raise ConfigError(f"the model is too large to build: {model} take {human_bytes(build_bytes)} of host memory, "
                          f"and only {human_bytes(host_available)} is available; lower {flags}")
    room = device_total if device_total is not None else host_available
    where = "the device has" if device_total is not None else "only this is available:"
    if room is not None and train_bytes > room:
        raise ConfigError(f"the model is too large to train: {model} with {batch} need about "
                          f"{human_bytes(train_bytes)} ({contents}), and {where} {human_bytes(room)}; lower {flags}")
