"""The ``torch.openreg`` device module of the test backend: what torch and devplug ask a device's module."""

from __future__ import annotations

import os
from typing import Any

import torch

from devplug_openreg import _backend


def _index(device: Any = None) -> int:
    if device is None:
        return int(_backend.current_device())
    if isinstance(device, int):
        return device
    device = torch.device(device)
    return int(_backend.current_device()) if device.index is None else int(device.index)


def is_available() -> bool:
    """True: the backend reports at least one device."""
    return int(_backend.device_count()) > 0


def device_count() -> int:
    """How many devices the backend reports."""
    return int(_backend.device_count())


def current_device() -> int:
    """The index of this thread's current device."""
    return int(_backend.current_device())


def set_device(device: Any) -> None:
    """Make ``device`` this thread's current device."""
    _backend.set_device(_index(device))


def synchronize(device: Any = None) -> None:
    """Nothing is queued: every kernel runs synchronously on the host."""


def is_initialized() -> bool:
    """Always initialised."""
    return True


def _is_in_bad_fork() -> bool:
    return False


def manual_seed(seed: int) -> None:
    """Seed the current device's generator."""
    _backend.manual_seed(int(seed), current_device())


def manual_seed_all(seed: int) -> None:
    """Seed every device's generator."""
    for index in range(device_count()):
        _backend.manual_seed(int(seed), index)


def get_rng_state(device: Any = "openreg") -> torch.Tensor:
    """The generator state of ``device`` (a CPU uint8 tensor)."""
    return _backend.get_rng_state(_index(device))


def set_rng_state(new_state: torch.Tensor, device: Any = "openreg") -> None:
    """Restore the generator state of ``device``."""
    _backend.set_rng_state(new_state, _index(device))


def memory_allocated(device: Any = None) -> int:
    """Bytes held by tensors on ``device`` (torch.accelerator's figure)."""
    return int(torch.accelerator.memory_allocated(_index(device)))


def max_memory_allocated(device: Any = None) -> int:
    """Peak bytes held by tensors on ``device``."""
    return int(torch.accelerator.max_memory_allocated(_index(device)))


def memory_reserved(device: Any = None) -> int:
    """Bytes reserved on ``device`` (no cache: the same as allocated)."""
    return int(torch.accelerator.memory_reserved(_index(device)))


def reset_peak_memory_stats(device: Any = None) -> None:
    """Start the peak from the current figure."""
    torch.accelerator.reset_peak_memory_stats(_index(device))


def is_bf16_supported(including_emulation: bool = True) -> bool:
    """bf16 runs in the CPU fallback, emulated as far as this backend is concerned."""
    return including_emulation


def get_amp_supported_dtype() -> list[torch.dtype]:
    """The dtypes torch.autocast may use on this device (``DEVPLUG_OPENREG_AMP_DTYPES=float16``: those named only).

    For another dtype torch.autocast warns "... the target dtype is not supported. Disabling autocast." and casts
    nothing: pytorch/pytorch v2.14.1, ``torch/amp/autocast_mode.py``, ``autocast.__init__`` (lines 268 and
    297-305 of the installed 2.14.1 wheel: ``get_amp_supported_dtype()`` read, then ``enabled = False``).
    """
    named = os.environ.get("DEVPLUG_OPENREG_AMP_DTYPES")
    if named is not None:
        return [getattr(torch, name.strip()) for name in named.split(",") if name.strip()]
    return [torch.float16, torch.bfloat16]
