"""Random number generators: seeding a run, and saving and restoring every RNG a checkpoint needs.

Python's, torch's CPU generator and the device's (through ``torch.get_device_module``, for any
device type torch knows whose module keeps generators: per device with ``get_rng_state_all``, or
the one device's with ``get_rng_state``).
"""

from __future__ import annotations

import logging
import random
from typing import Any

import torch

from devplug.core.fallback import accelerator

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
    return accelerator.device_module(device_type)


def _device_rng_functions(module: Any) -> tuple[Any, Any, bool]:
    """``(get, set, per_device)``: the module's RNG state functions for every device, else for its one device."""
    getter, setter = getattr(module, "get_rng_state_all", None), getattr(module, "set_rng_state_all", None)
    if getter is not None and setter is not None:
        return getter, setter, True
    return getattr(module, "get_rng_state", None), getattr(module, "set_rng_state", None), False


def rng_state(module: Any) -> dict[str, Any]:
    """Python, torch CPU and (where the device module keeps them) device RNG states.

    The device part is a list with one state per device: from ``get_rng_state_all`` where the module
    has it (``torch.cuda``, ``torch.xpu``, an out-of-tree backend's module), else a one-element list
    from ``get_rng_state`` (``torch.mps``, which has one device).
    """
    version, internal, gauss = random.getstate()
    state: dict[str, Any] = {"python": [version, list(internal), gauss], "torch": torch.get_rng_state()}
    getter, setter, per_device = _device_rng_functions(module)
    if getter is not None and setter is not None:
        try:
            state["device"] = list(getter()) if per_device else [getter()]
        except RuntimeError as exc:  # the device runtime is not initialised here: no device state to save
            log.debug("device RNG state not saved: %s", exc)
    return state


def restore_rng_state(state: dict[str, Any], module: Any) -> None:
    """Restore what `rng_state` saved (the device part only where this device module can take it)."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    torch.set_rng_state(state["torch"])
    saved = state.get("device")
    _getter, setter, per_device = _device_rng_functions(module)
    if not saved or setter is None:
        return
    try:
        if per_device:
            setter(saved)
        elif len(saved) == 1:
            setter(saved[0])
        else:
            raise IndexError(f"{len(saved)} device RNG states saved, this device module keeps one")
    except (RuntimeError, IndexError) as exc:  # fewer devices here than where it was saved, or none
        log.warning("device RNG state not restored (%s); the run continues with fresh device RNG", exc)
