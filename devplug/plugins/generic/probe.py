"""Is a device type usable here through torch's generic API, and if not, why and how to fix it.

In order: does torch have a module for the type (``torch.get_device_module``), was this torch built
with the backend (``torch.backends.<type>.is_built()`` or the module's ``_is_compiled()`` where
torch has them), does torch see a device (``torch.accelerator.is_available()`` for the current
accelerator, else the module's ``is_available()``), how many, and for an out-of-tree backend (a renamed
PrivateUse1 device) whether a tiny training step runs on it (`.trial`, once per machine). Never raises.
"""

from __future__ import annotations

import torch

from devplug import Availability
from devplug.plugins.generic.catalog import facts, privateuse1_name
from devplug.toolkit import device_available, device_count, device_module, probe_time_limit


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
    if device_type == privateuse1_name():
        return trained(device_type)
    return Availability.yes()


def trained(device_type: str) -> Availability:
    """An out-of-tree backend is available only if a tiny training step ran on it (see `.trial`)."""
    from devplug.plugins.generic.trial import TIMED_OUT, trial  # only an out-of-tree backend is tried

    tried = trial(device_type, probe_time_limit() * 0.9)
    if tried.ok("train"):
        return Availability.yes()
    problem = tried.problem("train")
    if TIMED_OUT in problem:
        return Availability.no(
            f"{tried.who()} was tried on a tiny training step, which {problem}",
            "raise DEVPLUG_PROBE_TIMEOUT (seconds): the first trial imports the backend in a new process; it is "
            "kept once it finishes")
    return Availability.no(
        f"{tried.who()} is present but could not train a Linear layer: {problem}",
        f"check that {tried.backend} was built for torch {torch.__version__}, or report this to its maintainers")


def count(device_type: str) -> int:
    """How many ``device_type`` devices this process sees (0 when none or when torch cannot say)."""
    try:
        return device_count(device_type)
    except Exception:
        return 0
