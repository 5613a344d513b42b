"""Device registry and resolution: from ``"auto"``, ``"cpu"`` or ``"cuda:1"`` to one device plugin.

The core never names a device here: it asks every plugin which devices it serves, probes them only
when needed, and picks by the priority each plugin declared. ``"auto"`` probes in priority order and
stops at the first available device; a device asked for by name probes only itself (and, when it is
unavailable, the others, to list them in the error). Every probe runs under a time limit
(`devplug.core.registry.registered`).
"""

from __future__ import annotations

import functools
import logging
import os
import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Concatenate, ParamSpec, TypeVar

from devplug.core.contract import hookspecs
from devplug.core.contract.records import Device
from devplug.core.errors import DeviceUnavailableError, PluginError, UnknownDeviceError
from devplug.core.registry.bounded import time_limit
from devplug.core.registry.contract_gaps import warn_gaps
from devplug.core.registry.manager import ENV_BLOCK, DevplugPluginManager, get_plugin_manager
from devplug.core.registry.registered import RegisteredDevice

log = logging.getLogger("devplug")

ENV_DEVICE = "DEVPLUG_DEVICE"
P = ParamSpec("P")
R = TypeVar("R")
_REQUEST_RE = re.compile(r"^(?P<name>[a-z][a-z0-9_]*)(?::(?P<index>\d+))?$")


class DeviceRegistry:
    """All devices the loaded plugins declare, keyed by name, with the name conflicts that were resolved."""

    def __init__(self, pm: DevplugPluginManager | None = None) -> None:
        self.pm = pm or get_plugin_manager()
        table, self.conflicts = self.pm.device_table()
        self.devices: dict[str, RegisteredDevice] = {
            d.spec.name: RegisteredDevice(d.spec, d.plugin_name, self.pm.get_plugin(d.plugin_name), d.distribution)
            for d in table
        }

    def names(self) -> list[str]:
        """Device names, highest priority first."""
        return [d.spec.name for d in sorted(self.devices.values(), key=lambda d: -d.spec.priority)]

    def device_plugin_names(self) -> set[str]:
        """Names of the device plugins (those that declare devices, whether or not they keep every name)."""
        return set(self.pm.declared_devices())

    def probe_all(self, deadline: float | None = None) -> None:
        """Probe every device at once, each in its own thread, waiting at most one time limit in all.

        ``deadline`` (a ``time.monotonic()`` value) replaces "one time limit from now".
        """
        for entry in self.devices.values():
            entry.start_probe()
        deadline = time.monotonic() + time_limit() if deadline is None else deadline
        for name in self.names():
            self.devices[name].availability(deadline)

    def available_names(self) -> list[str]:
        """Names of devices usable on this machine, highest priority first (every device is probed)."""
        self.probe_all()
        return [n for n in self.names() if self.devices[n].availability().available]

    def first_available(self, skip: Sequence[str] = ()) -> str | None:
        """The highest-priority available device not in ``skip``; devices ranked below it are not probed."""
        for name in self.names():
            if name not in skip and self.devices[name].availability().available:
                return name
        return None

    def open(self, request: str | None = None, *, options: Mapping[str, Any] | None = None,
             channels_last: bool | str = False) -> DeviceHooks:
        """Resolve ``request``, route its hooks and run ``devplug_device_setup``: the hooks of a ready device.

        With ``"auto"``, a device whose plugin fails to set it up (raises, or calls ``sys.exit``) is reported
        with its plugin and distribution, and the next available device is tried; a device asked for by
        name fails with that report.
        """
        request = self._request(request)
        skipped: list[str] = []
        while True:
            device = self.resolve(request, options=options, channels_last=channels_last, skip=skipped)
            hooks = DeviceHooks(self, device)
            try:
                hooks(hookspecs.devplug_device_setup)
                self._warn_contract_gaps(device)
                return hooks
            except PluginError as exc:
                if request != "auto":
                    raise
                log.warning("device %s could not be set up, trying the next available one: %s", device, exc)
                skipped.append(device.name)

    def _warn_contract_gaps(self, device: Device) -> None:
        entry = self.devices[device.name]
        implements = {caller.name for caller in self.pm.get_hookcallers(entry.plugin) or []}
        warn_gaps(device, entry.plugin, entry.plugin_name, entry.distribution, implements)

    @staticmethod
    def _request(request: str | None) -> str:
        if request is None:
            request = os.environ.get(ENV_DEVICE, "").strip() or "auto"
        return request.strip().lower()

    def resolve(
        self, request: str | None = None, *, options: Mapping[str, Any] | None = None,
        channels_last: bool | str = False, skip: Sequence[str] = (),
    ) -> Device:
        """Turn a request (``None`` → ``$DEVPLUG_DEVICE`` or ``"auto"``) into a usable `Device`.

        ``options`` (free-form device options) and ``channels_last`` are the Trainer options the device
        carries to every hook (``channels_last="auto"``: the device's ``prefers_channels_last``, whose
        reason the device keeps as ``layout_reason``); ``"auto"`` passes over the device names in ``skip``.
        """
        request = self._request(request)
        if request == "auto":
            chosen = self.first_available(skip)
            if chosen is None:
                raise DeviceUnavailableError(
                    "no device is available; known devices: " + self._describe_known()
                    + (f" (could not be set up: {', '.join(skip)})" if skip else "")
                )
            entry, index = self.devices[chosen], None
        else:
            match = _REQUEST_RE.match(request)
            if match is not None and match["name"] not in self.devices and self.pm.is_blocked_name(match["name"]):
                raise DeviceUnavailableError(
                    f"device {match['name']!r} is blocked: its plugin {match['name']!r} is named in {ENV_BLOCK}, so "
                    f"it was not loaded; remove it from {ENV_BLOCK} to use the device. Available devices: "
                    f"{', '.join(self.available_names()) or 'none'}")
            if match is None or match["name"] not in self.devices:
                raise UnknownDeviceError(
                    f"unknown device {request!r}; known devices: {self._describe_known()}. "
                    "Use 'auto', one of those names, or NAME:INDEX; install a plugin for other devices"
                    + self._load_problems(match["name"] if match else request)
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
                visible = (f"{count} {entry.spec.name} device(s) visible (indices 0..{count - 1})" if count else
                           f"no {entry.spec.name} device is counted: {entry.count_problem}" if entry.count_problem
                           else f"no {entry.spec.name} device is visible to this process")
                raise DeviceUnavailableError(f"device {request!r} does not exist: {visible}")
        layout_reason = ""
        if channels_last == "auto":
            preference = entry.spec.prefers_channels_last
            channels_last = bool(preference)
            layout_reason = (f"the {entry.plugin_name} plugin's choice: {preference}" if preference
                             else f"the {entry.plugin_name} plugin prefers no other")
        try:
            return Device(spec=entry.spec, index=index, plugin_name=entry.plugin_name, options=dict(options or {}),
                          channels_last=bool(channels_last), layout_reason=layout_reason)
        except RuntimeError as exc:  # torch.device() of a type no loaded backend registered
            raise PluginError(
                f"device {entry.spec.name!r} of plugin {entry.plugin_name!r} ({entry.distribution}) places tensors "
                f"on torch device type {entry.spec.torch_type!r}, which torch does not know here "
                f"({str(exc).splitlines()[0]}); its runtime has not registered that backend with torch, or "
                f"DeviceSpec.torch_type is wrong: report this to the maintainers of {entry.distribution}"
            ) from None

    def _load_problems(self, name: str) -> str:
        """Plugin load failures (and skipped clashing devices) that may explain a missing device."""
        related = [str(f) for f in self.pm.failures if f.name.lower() == name]
        related += [str(c) for c in self.conflicts if c.skipped.spec.name == name]
        if not related and self.pm.failures:
            related = [f"{len(self.pm.failures)} plugin(s) failed to load: "
                       + "; ".join(str(f) for f in self.pm.failures)]
        return "".join(f". Note: {text}" for text in related)

    def _describe_known(self) -> str:
        self.probe_all()
        parts = []
        for name in self.names():
            availability = self.devices[name].availability()
            parts.append(name if availability.available else f"{name} (unavailable: {availability.reason})")
        return ", ".join(parts) or "none (no device plugin loaded)"


class DeviceHooks:
    """Operational hooks routed to one device plugin plus the device-neutral plugins.

    ``hooks(hookspecs.devplug_optimizer, name=..., params=..., options=...)`` calls the hook on the
    resolved device's plugin, on every plugin that declares no device, and on the core fallback, never
    on other device plugins; ``device`` is filled in. The call is typed by the spec function itself:
    its keyword arguments and its return type are the spec's.

    The plugins are fixed once a Trainer exists, so each hook's route is resolved here, once: a hook
    nobody implements for this device (``devplug_mark_step`` on an eager device) costs nothing per call,
    and a hook with a single implementation and no wrapper (``devplug_region`` answered by the fallback
    alone) calls it directly, with pluggy's semantics, instead of through pluggy's dispatch.
    """

    def __init__(self, registry: DeviceRegistry, device: Device) -> None:
        self.device = device
        pm = registry.pm
        others = [pm.get_plugin(name) for name in registry.device_plugin_names() - {device.plugin_name}]
        self._callers: dict[str, Callable[..., Any]] = {}
        self._answered_by: dict[str, tuple[str, ...]] = {}
        self._impls: dict[str, list[Any]] = {}
        self._firstresult: dict[str, bool] = {}
        for name in hookspecs.OPERATIONAL_HOOKS:
            caller = pm.subset_hook_caller(name, remove_plugins=[p for p in others if p is not None])
            self._callers[name] = _direct_call(caller, device) or functools.partial(caller, device=device)
            self._impls[name] = caller.get_hookimpls()
            self._answered_by[name] = tuple(impl.plugin_name for impl in self._impls[name])
            self._firstresult[name] = bool(caller.spec is not None and caller.spec.opts.get("firstresult"))

    def answered_by(self, spec: Callable[..., Any], /) -> tuple[str, ...]:
        """The names of the plugins implementing hook ``spec`` for this device (empty: nobody does).

        The step asks once whether only the core fallback answers a per-step hook (no region marking, no
        step marking), and then leaves the call out of every step.
        """
        return self._answered_by[spec.__name__]

    def each_answer(self, spec: Callable[..., Any], /, **kwargs: Any) -> dict[str, Any]:
        """Each implementing plugin's own answer to hook ``spec``, by plugin name, for hooks asked once.

        The (guarded) implementations are called one by one, so each answer is known with the plugin that
        gave it; a wrapper is not called (it has no answer of its own).
        """
        kwargs["device"] = self.device
        return {impl.plugin_name: impl.function(*[kwargs[name] for name in impl.argnames])
                for impl in self._impls[spec.__name__] if not (impl.wrapper or impl.hookwrapper)}

    def first_answer(self, spec: Callable[..., Any], /, **kwargs: Any) -> tuple[Any, str | None]:
        """A first-result hook's answer and the name of the plugin that gave it (``(None, None)``: nobody).

        For hooks asked once (the peak FLOP/s), where a problem with the answer must name its plugin: the
        implementations are called in pluggy's order; with a wrapper among them, pluggy itself is called and
        the plugin is not known (``None``).
        """
        impls = self._impls[spec.__name__]
        if any(impl.wrapper or impl.hookwrapper for impl in impls):
            return self._callers[spec.__name__](**kwargs), None
        kwargs["device"] = self.device
        for impl in reversed(impls):  # pluggy calls the last registered (and tryfirst) first
            answer = impl.function(*[kwargs[name] for name in impl.argnames])
            if answer is not None:
                return answer, impl.plugin_name
        return None, None

    def __call__(self, spec: Callable[Concatenate[Device, P], R], /, *args: P.args, **kwargs: P.kwargs) -> R:
        """Call the hook ``spec`` (a function of `devplug.core.contract.hookspecs`) with keyword arguments."""
        if args:
            raise TypeError("hook arguments are passed by keyword")
        return self._callers[spec.__name__](**kwargs)

    def caller(self, spec: Callable[..., Any], argument: str, /) -> Callable[[Any], Any]:
        """A one-argument call of hook ``spec``: ``caller(obj)`` answers as ``hooks(spec, argument=obj)`` does,
        resolved once, for a hook called per batch (``devplug_to_device``).

        A first-result hook without wrappers calls its (guarded) implementations directly in pluggy's order,
        with the device and the value in the order each declares them, until one answers; any other route
        goes through `__call__`'s.
        """
        name = spec.__name__
        impls = self._impls[name]
        calls = [_unary(impl.function, tuple(impl.argnames), self.device, argument) for impl in reversed(impls)]
        route = self._callers[name]
        if (not impls or not self._firstresult[name] or any(impl.wrapper or impl.hookwrapper for impl in impls)
                or any(call is None for call in calls)):
            return lambda value: route(**{argument: value})
        if len(calls) == 1:
            assert calls[0] is not None
            return calls[0]
        ordered = tuple(call for call in calls if call is not None)

        def first(value: Any) -> Any:
            for call in ordered:  # pluggy calls the last registered (and tryfirst) first
                answer = call(value)
                if answer is not None:
                    return answer
            return None

        return first


def _unary(function: Callable[..., Any], argnames: tuple[str, ...], device: Device,
           argument: str) -> Callable[[Any], Any] | None:
    """``function`` called with ``device`` and one value, in the order its ``argnames`` take them (``None``: other
    arguments)."""
    if argnames == ("device", argument):
        return functools.partial(function, device)
    if argnames == (argument, "device"):
        return lambda value: function(value, device)
    if argnames == (argument,):
        return function
    if argnames == ("device",):
        return lambda _value: function(device)
    if not argnames:
        return lambda _value: function()
    return None


def _direct_call(caller: Any, device: Device) -> Callable[..., Any] | None:
    """A call with pluggy's result semantics that skips its dispatch, where the route allows; else ``None``."""
    impls = caller.get_hookimpls()
    firstresult = bool(caller.spec is not None and caller.spec.opts.get("firstresult"))
    if not impls:
        return (lambda **_kwargs: None) if firstresult else (lambda **_kwargs: [])
    if len(impls) > 1 or impls[0].wrapper or impls[0].hookwrapper:
        return None
    function, argnames = impls[0].function, impls[0].argnames

    def call(**kwargs: Any) -> Any:
        kwargs["device"] = device
        result = function(*[kwargs[name] for name in argnames])
        if firstresult:
            return result
        return [] if result is None else [result]

    return call
