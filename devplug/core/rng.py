"""Random number generators: seeding a run, and saving and restoring every RNG a checkpoint needs.

Python's, torch's CPU generator and the device's (through ``torch.get_device_module``, for any
device type torch knows whose module keeps per-device generators).
"""

from __future__ import annotations

import logging
import random
from typing import Any

import torch

log = logging.getLogger("devplug")


def seed_everything(seed: int) -> None:
    """Seed Python, numpy (when installed) and torch (every device torch knows) with ``seed``."""
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy
    except ImportError:
        return
    numpy.random.seed(seed % 2**32)


def device_module(device_type: str) -> Any:
    """torch's module for a device type (``torch.cuda`` for ``"cuda"``), or ``None`` when torch has none."""
    try:
        return torch.get_device_module(device_type)
    except (RuntimeError, AttributeError, ValueError):
        return None


def rng_state(module: Any) -> dict[str, Any]:
    """Python, torch CPU and (where the device module keeps them) device RNG states."""
    version, internal, gauss = random.getstate()
    state: dict[str, Any] = {"python": [version, list(internal), gauss], "torch": torch.get_rng_state()}
    getter = getattr(module, "get_rng_state_all", None)
    if getter is not None:
        try:
            state["device"] = list(getter())
        except RuntimeError as exc:  # the device runtime is not initialised here: no device state to save
            log.debug("device RNG state not saved: %s", exc)
    return state


def restore_rng_state(state: dict[str, Any], module: Any) -> None:
    """Restore what :func:`rng_state` saved (the device part only where this device module can take it)."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    torch.set_rng_state(state["torch"])
    setter = getattr(module, "set_rng_state_all", None)
    if state.get("device") and setter is not None:
        try:
            setter(state["device"])
        except (RuntimeError, IndexError) as exc:  # fewer devices here than where it was saved, or none
            log.warning("device RNG state not restored (%s); the run continues with fresh device RNG", exc)
