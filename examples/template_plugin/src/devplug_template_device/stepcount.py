"""A device-neutral plugin: counts step marks on every device and puts profiler ranges around them.

It registers no device, so devplug calls it for whichever device is resolved, alongside that device's
plugin. ``wrapper=True`` makes ``devplug_mark_step`` a pluggy new-style wrapper: the code before
``yield`` runs before every other implementation of the hook, the code after it once they all returned
(or raised), and the wrapper returns their result.

Block it with ``DEVPLUG_BLOCK_PLUGINS=cpusim_stepcount``.
"""

from __future__ import annotations

import collections
from collections.abc import Generator
from typing import Any

import torch

import devplug

DEVPLUG_CONTRACT = "1.9"

#: Step marks seen, per ``"<device>:<phase>"``.
COUNTS: collections.Counter[str] = collections.Counter()


@devplug.hookimpl(wrapper=True)
def devplug_mark_step(device: devplug.Device, phase: devplug.Phase) -> Generator[None, Any, Any]:
    """Count the mark and time the device's own step marking in a ``torch.profiler`` range."""
    COUNTS[f"{device.name}:{phase.value}"] += 1
    with torch.profiler.record_function(f"mark_step:{phase.value}"):
        result = yield
    return result


def steps(device: str) -> int:
    """Optimizer steps counted on ``device`` so far."""
    return COUNTS[f"{device}:{devplug.Phase.OPTIMIZER_STEP.value}"]
