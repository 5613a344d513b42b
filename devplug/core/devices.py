"""Device registry and resolution: from ``"auto"``, ``"cpu"`` or ``"cuda:1"`` to one device plugin.

The core never names a device here: it asks every plugin which devices it serves, probes them only
when needed, and picks by the priority each plugin declared.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Mapping
from typing import Any

import attrs

from devplug.core import hookspecs
from devplug.core.errors import DeviceUnavailableError, PluginConflictError, UnknownDeviceError
from devplug.core.manager import DevplugPluginManager, PluginSource, get_plugin_manager
from devplug.core.records import Availability, Device, DeviceSpec

ENV_DEVICE = "DEVPLUG_DEVICE"
_REQUEST_RE = re.compile(r"^(?P<name>[a-z][a-z0-9_]*)(?::(?P<index>\d+))?$")


@attrs.define
class RegisteredDevice:
    """A device spec together with the plugin that registered it."""

    spec: DeviceSpec
    plugin_name: str
    plugin: Any
    distribution: str
    _availability: Availability | None = attrs.field(default=None, alias="_availability")

    def availability(self) -> Availability:
        """Run the probe once (a probe that raises reports the exception as the reason)."""
        if self._availability is None:
            try:
                result = self.spec.probe()
                if not isinstance(result, Availability):
                    raise TypeError(f"probe returned {result!r}, not an Availability")
            except Exception as exc:
                result = Availability.no(
                    f"its availability probe raised {type(exc).__name__}: {exc}",
                    f"report this to the maintainers of {self.distribution}",
                )
            self._availability = result
        return self._availability

    def count(self) -> int:
        """How many devices of this type are visible (0 when unavailable or when counting fails)."""
        if not self.availability().available:
            return 0
        try:
            return int(self.spec.count())
        except Exception:
            return 0


class DeviceRegistry:
    """All device types the loaded plugins serve, keyed by name."""

    def __init__(self, pm: DevplugPluginManager | None = None) -> None:
        self.pm = pm or get_plugin_manager()
        self.devices: dict[str, RegisteredDevice] = {}
        for impl in self.pm.hook.devplug_register_devices.get_hookimpls():
            if impl.hookwrapper or impl.wrapper:
                continue
            self._collect(impl.plugin_name, impl.plugin, impl.function)

    def _collect(self, plugin_name: str, plugin: Any, function: Any) -> None:
        distribution = self.pm.distribution_of(plugin_name)
        try:
            answer = function()
            specs = [] if answer is None else [answer] if isinstance(answer, DeviceSpec) else list(answer)
            for spec in specs:
                if not isinstance(spec, DeviceSpec):
                    raise TypeError(f"devplug_register_devices returned {spec!r}, not a DeviceSpec")
        except Exception as exc:
            self.pm.unregister(name=plugin_name)
            self.pm._record_failure(PluginSource(plugin_name, distribution, lambda: None), exc)
            return
        for spec in specs:
            other = self.devices.get(spec.name)
            if other is not None:
                raise PluginConflictError(
                    f"device {spec.name!r} is registered twice: by plugin {other.plugin_name!r} "
                    f"({other.distribution}) and by plugin {plugin_name!r} ({distribution}). "
                    f"Block one of them, e.g. DEVPLUG_BLOCK_PLUGINS={plugin_name}"
                )
            self.devices[spec.name] = RegisteredDevice(spec, plugin_name, plugin, distribution)

    def names(self) -> list[str]:
        """Device names, highest priority first."""
        return [d.spec.name for d in sorted(self.devices.values(), key=lambda d: -d.spec.priority)]

    def device_plugin_names(self) -> set[str]:
        """Names of plugins that registered at least one device."""
        return {d.plugin_name for d in self.devices.values()}

    def available_names(self) -> list[str]:
        """Names of devices usable on this machine, highest priority first."""
        return [n for n in self.names() if self.devices[n].availability().available]

    def resolve(self, request: str | None = None, options: Mapping[str, Any] | None = None) -> Device:
        """Turn a request (``None`` → ``$DEVPLUG_DEVICE`` or ``"auto"``) into a usable :class:`Device`."""
        if request is None:
            request = os.environ.get(ENV_DEVICE, "").strip() or "auto"
        request = request.strip().lower()
        if request == "auto":
            available = self.available_names()
            if not available:
                raise DeviceUnavailableError(
                    "no device is available; known devices: " + self._describe_known()
                )
            entry, index = self.devices[available[0]], None
        else:
            match = _REQUEST_RE.match(request)
            if match is None or match["name"] not in self.devices:
                raise UnknownDeviceError(
                    f"unknown device {request!r}; known devices: {self._describe_known()}. "
                    "Use 'auto', one of those names, or NAME:INDEX; install a plugin for other devices"
                )
            entry = self.devices[match["name"]]
            index = int(match["index"]) if match["index"] is not None else None
            availability = entry.availability()
            if not availability.available:
                fix = f" To fix: {availability.fix}." if availability.fix else ""
                raise DeviceUnavailableError(
                    f"device {entry.spec.name!r} is not available: {availability.reason}.{fix} "
                    f"Available devices: {', '.join(self.available_names()) or 'none'}"
                )
            count = entry.count()
            if index is not None and index >= count:
                raise DeviceUnavailableError(
                    f"device {request!r} does not exist: {count} {entry.spec.name} device(s) visible "
                    f"(indices 0..{count - 1})"
                )
        return Device(spec=entry.spec, index=index, plugin_name=entry.plugin_name, options=dict(options or {}))

    def _describe_known(self) -> str:
        parts = []
        for name in self.names():
            availability = self.devices[name].availability()
            parts.append(name if availability.available else f"{name} (unavailable: {availability.reason})")
        return ", ".join(parts) or "none (no device plugin loaded)"


class DeviceHooks:
    """Operational hooks routed to one device plugin plus the device-neutral plugins.

    ``hooks.devplug_optimizer(name=..., ...)`` calls the hook on the resolved device's plugin, on
    every plugin that registered no device, and on the core fallback, never on other device plugins.
    The ``device`` argument is filled in.
    """

    def __init__(self, registry: DeviceRegistry, device: Device) -> None:
        self.device = device
        others = [
            registry.pm.get_plugin(name)
            for name in registry.device_plugin_names() - {device.plugin_name}
            if registry.pm.get_plugin(name) is not None
        ]
        self._callers = {
            name: registry.pm.subset_hook_caller(name, remove_plugins=others)
            for name in hookspecs.OPERATIONAL_HOOKS
        }

    def __getattr__(self, name: str) -> Any:
        try:
            caller = self._callers[name]
        except KeyError:
            raise AttributeError(name) from None
        return functools.partial(caller, device=self.device)
