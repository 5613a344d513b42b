"""Is a device type usable here through torch's generic API, and if not, why and how to fix it.

In order: does torch have a module for the type (``torch.get_device_module``), was this torch built
with the backend (``torch.backends.<type>.is_built()`` or the module's ``_is_compiled()`` where
torch has them), does torch see a device (``torch.accelerator.is_available()`` for the current
accelerator, else the module's ``is_available()``), and how many. Never raises.
"""

from __future__ import annotations

import torch

from devplug import Availability
from devplug.plugins.generic.catalog import facts
from devplug.toolkit import device_available, device_count, device_module


def built_with(device_type: str, module: object) -> bool | None:
    """Whether this torch was built with ``device_type``'s backend; ``None`` where torch does not say."""
    backend = getattr(torch.backends, device_type, None)
    for ask in (getattr(backend, "is_built", None), getattr(module, "_is_compiled", None)):
        if ask is not None:
            try:
                return bool(ask())
            except Exception:  # an answer we cannot get is no answer
                continue
    return None


def probe(device_type: str) -> Availability:
    """Whether ``device_type`` is usable here, else the reason and the fix. Never raises."""
    about = facts(device_type)
    module = device_module(device_type)
    if module is None:
        return Availability.no(f"torch {torch.__version__} has no {device_type} backend loaded "
                               f"(torch.get_device_module({device_type!r}) finds no module)", about.install)
    if built_with(device_type, module) is False:
        return Availability.no(f"this torch build ({torch.__version__}) was built without {device_type} support",
                               about.install)
    try:
        seen = device_available(device_type)
        seen = device_count(device_type) > 0 if seen is None else seen
    except Exception as exc:
        return Availability.no(f"torch could not query {device_type} devices ({type(exc).__name__}: {exc})",
                               f"check the {about.label} driver and runtime")
    if not seen or count(device_type) < 1:
        return Availability.no(f"torch sees no {device_type} device ({about.label}) on this machine",
                               "run on a machine that has one, or check its driver and runtime")
    return Availability.yes()


def count(device_type: str) -> int:
    """How many ``device_type`` devices this process sees (0 when none or when torch cannot say)."""
    try:
        return device_count(device_type)
    except Exception:
        return 0
