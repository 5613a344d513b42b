"""Plain-PyTorch recipes that the core fallback and device plugins share (public through devplug.toolkit).

Standard optimizer names and their torch classes and defaults, precision plans built from
``torch.autocast`` and ``torch.amp.GradScaler``, and the memory figure of the host process.
"""

from __future__ import annotations

import functools
import inspect
import logging
import platform
from typing import Any

import torch

from devplug.core.errors import OptimizerError, PrecisionError
from devplug.core.records import Device, MemoryStats, PrecisionPlan

log = logging.getLogger("devplug")

#: Standard optimizer names and their torch classes.
TORCH_OPTIMIZERS: dict[str, str] = {
    "adam": "Adam",
    "adamw": "AdamW",
    "sgd": "SGD",
    "rmsprop": "RMSprop",
    "adagrad": "Adagrad",
    "adamax": "Adamax",
    "nadam": "NAdam",
    "radam": "RAdam",
    "lamb": "",  # no torch implementation; plugins with apex provide it
}


def torch_optimizer_class(name: str) -> type[torch.optim.Optimizer]:
    """The ``torch.optim`` class for a standard optimizer name, or an :class:`OptimizerError`."""
    cls_name = TORCH_OPTIMIZERS.get(name.lower())
    if not cls_name:
        known = ", ".join(n for n, c in TORCH_OPTIMIZERS.items() if c)
        raise OptimizerError(f"unknown optimizer {name!r}; torch provides: {known}")
    return getattr(torch.optim, cls_name)


@functools.cache
def torch_optimizer_defaults(cls: type[torch.optim.Optimizer]) -> dict[str, Any]:
    """The keyword defaults of a torch optimizer's constructor, e.g. ``{"lr": 0.001, "betas": ...}``.

    Plugins mapping an author's options onto a vendor optimizer start from these, so an option the author
    left out behaves as it would in ``torch.optim``.
    """
    return {
        name: p.default
        for name, p in inspect.signature(cls).parameters.items()
        if p.default is not inspect.Parameter.empty
    }


def autocast_plan(device: Device, precision: str, *, scaler: bool | None = None) -> PrecisionPlan:
    """A precision plan built only from ``torch.autocast`` and ``torch.amp.GradScaler``.

    ``"16-mixed"`` gets a grad scaler unless ``scaler=False``; ``"bf16-mixed"`` none.
    """
    kind = device.torch_device.type
    if precision == "32-true":
        return PrecisionPlan(name="32-true", description="full fp32")
    if precision not in ("16-mixed", "bf16-mixed"):
        raise PrecisionError(f"precision {precision!r} is not one of 32-true, 16-mixed, bf16-mixed, auto")
    dtype = torch.float16 if precision == "16-mixed" else torch.bfloat16
    if not torch.amp.is_autocast_available(kind):
        raise PrecisionError(f"torch has no autocast for device type {kind!r}; use precision='32-true'")
    use_scaler = (precision == "16-mixed") if scaler is None else scaler
    grad_scaler = torch.amp.GradScaler(kind) if use_scaler else None
    return PrecisionPlan(
        name=precision,
        autocast=lambda: torch.autocast(device_type=kind, dtype=dtype),
        scaler=grad_scaler,
        description=f"torch.autocast({kind!r}, {str(dtype).replace('torch.', '')})"
        + (" + GradScaler" if grad_scaler is not None else ""),
    )




def process_memory_stats() -> MemoryStats:
    """Peak resident memory of this process as the OS reports it (the host's figure for CPU-resident devices)."""
    try:
        import resource

        scale = 1 if platform.system() == "Darwin" else 1024  # ru_maxrss is bytes on macOS, KiB on Linux
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale
    except (ImportError, OSError):
        peak = None
    return MemoryStats(peak_allocated=peak)


_logged: set[str] = set()


def log_once(message: str, level: int = logging.INFO, *, logger: str = "devplug") -> None:
    """Log ``message`` on ``logger`` at ``level`` the first time it comes up in this process."""
    if message not in _logged:
        _logged.add(message)
        logging.getLogger(logger).log(level, "%s", message)


def forget_logged() -> None:
    """Forget which messages :func:`log_once` has logged (tests)."""
    _logged.clear()
