"""Process-wide state of the Gaudi plugin: the runtime handle, the execution mode, one-time actions.

Everything here is filled in lazily, once a Gaudi device has been selected; nothing is imported from
the Intel Gaudi stack when this module is imported.
"""

from __future__ import annotations

import logging
from typing import Any

import attrs

from devplug.toolkit import forget_logged
from devplug.toolkit import log_once as toolkit_log_once

LOGGER = "devplug.plugins.hpu"


@attrs.define
class HpuRuntime:
    """What the plugin learned about the Gaudi runtime in this process.

    - ``htcore``: ``habana_frameworks.torch.core``, imported by ``devplug_device_setup``.
    - ``lazy``: True in lazy mode (graphs flushed by ``htcore.mark_step()``), False in eager mode.
    - ``hmp_converted``: ``hmp.convert`` has patched torch (it must run once per process).
    - ``hmp_settings``: the settings it patched torch with (a later plan must ask for the same).
    - ``clippers``: ``FusedClipNorm`` objects by ``(max_norm, dtype)`` (each holds ``max_norm`` on the device).
    """

    htcore: Any = None
    lazy: bool | None = None
    hmp_converted: bool = False
    hmp_settings: Any = None
    clippers: dict[tuple[float, Any], Any] = attrs.field(factory=dict)


_runtime = HpuRuntime()


def state() -> HpuRuntime:
    """The plugin's process-wide state."""
    return _runtime


def reset() -> None:
    """Forget everything learned (tests; a real process keeps one Gaudi runtime for its lifetime)."""
    global _runtime
    _runtime = HpuRuntime()
    forget_logged()


def log_once(message: str, level: int = logging.INFO) -> None:
    """Log ``message`` on the plugin's logger at ``level`` the first time it comes up in this process."""
    toolkit_log_once(message, level, logger=LOGGER)
