"""Will the model fit? The network's size from the flags (built on the meta device: no memory used) against
the memory there is, checked before anything is allocated, so ``--width 1000000`` is one line, not an
allocator traceback."""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch

from devplug import ConfigError

from lm.models import LanguageModel, ModelSpec, count_parameters

#: fp32 weight, gradient and AdamW's two moments.
TRAINING_BYTES_PER_PARAMETER = 16
#: Activation values kept for backward per token and layer, in units of the width (attention and 4x MLP).
ACTIVATIONS_PER_TOKEN_AND_LAYER = 20


def human_bytes(nbytes: float) -> str:
    """``1.2 GB``-style size (powers of 1000, as ``df -H`` prints)."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if nbytes < 1000 or unit == "TB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1000
    raise AssertionError("unreachable")


def available_host_memory() -> int | None:
    """Bytes this process may still allocate: ``MemAvailable``, capped by a cgroup v2 limit; None if unknown."""
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


def parameter_count(spec: ModelSpec) -> int:
    """The network's trainable parameters, counted on the meta device (nothing is allocated)."""
    with torch.device("meta"):
        return count_parameters(LanguageModel(spec))


def check_memory(spec: ModelSpec, batch_size: int, *, shards: int, device_total: int | None,
                 host_available: int | None) -> None:
    """Raise `devplug.ConfigError` when the network cannot be built or trained in the memory there is.

    It is built in host memory (4 bytes per parameter), then trained where the device plugin puts it
    (``device_total`` bytes, or host memory when the device reports none), its training state split over
    ``shards`` ranks under FSDP.
    """
    params = parameter_count(spec)
    weights = 4 * params
    training = TRAINING_BYTES_PER_PARAMETER * params // shards + 4 * batch_size * spec.context * (
        ACTIVATIONS_PER_TOKEN_AND_LAYER * spec.width * spec.layers + 2 * 256)
    sizes = f"{params:,} parameters (--width {spec.width}, --layers {spec.layers})"
    flags = "--width/--layers/--context/--batch-size"
    if host_available is not None and weights > host_available:
        raise ConfigError(f"the model is too large to build: {sizes} take {human_bytes(weights)} of host memory, "
                          f"and only {human_bytes(host_available)} is available; lower {flags}")
    room = device_total if device_total is not None else host_available
    where = "the device has" if device_total is not None else "only this is available:"
    if room is not None and training > room:
        raise ConfigError(f"the model is too large to train: {sizes} with a batch of {batch_size} x {spec.context} "
                          f"need about {human_bytes(training)} (weights, gradients, AdamW state, activations), and "
                          f"{where} {human_bytes(room)}; lower {flags}")
