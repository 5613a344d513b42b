"""Settings a device's plugin may not know: asked for of a plugin that declares an older contract, warned once.

A plugin written for contract 1.0 implements ``devplug_to_device`` without knowing ``Device.channels_last``
(contract 1.1): asked for ``channels_last=True``, it moves everything in the default layout, and the run is
silently slower. The Trainer still asks (the plugin may honour it anyway), and says once per process and
plugin that the plugin may not.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import attrs

from devplug.core.contract.records import Device
from devplug.core.contract.versions import _plain_version
from devplug.core.log_once import log_once


@attrs.frozen
class Setting:
    """A setting a hook sees from contract ``since`` on, and whether a device asks for it."""

    name: str
    since: str
    hook: str
    asked: Callable[[Device], bool]


#: The settings introduced after contract 1.0 that change what a device plugin's hook must do.
SETTINGS = (
    Setting("channels_last=True", "1.1", "devplug_to_device", lambda device: device.channels_last),
)


def warn_gaps(device: Device, plugin: Any, plugin_name: str, distribution: str, implements: set[str]) -> list[str]:
    """Warn once for each setting ``device`` asks of ``plugin`` that its declared contract predates; the warnings."""
    declared = str(getattr(plugin, "DEVPLUG_CONTRACT", "") or "").strip()
    version = _plain_version(declared)
    if version is None:  # undeclared (held to the current contract) or a range that includes it
        return []
    warnings = []
    for setting in SETTINGS:
        since = _plain_version(setting.since)
        if since is not None and version < since and setting.hook in implements and setting.asked(device):
            text = (f"plugin {plugin_name!r} ({distribution}) declares hook contract {declared}, older than "
                    f"{setting.since} where {setting.name} reached {setting.hook}: its {setting.hook} may ignore "
                    f"it; ask the maintainers of {distribution} for a release that declares {setting.since} or newer")
            log_once(text, logging.WARNING)
            warnings.append(text)
    return warnings
