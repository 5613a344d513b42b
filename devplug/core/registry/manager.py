"""Plugin loading: built-ins and entry points through one path, failures and conflicts contained.

A plugin is any object (usually a module) with ``@devplug.hookimpl`` functions. Built-in plugins and
third-party ones registered under the ``devplug`` entry-point group are loaded the same way:
imported, checked against the hook contract version, registered with pluggy (which validates hook
signatures; every hook implementation is then guarded, see `devplug.core.registry.guard`), checked for
unknown hooks, and, if the plugin implements ``devplug_register_devices``, asked for its devices. A
plugin that fails any step is recorded as a `PluginFailure` with its distribution and the
error, logged once, and left out; the rest keep working. Loading also measures each plugin's import time
(`DevplugPluginManager.import_seconds`, shown by ``devplug devices --verbose``; a third party's import
over `SLOW_IMPORT_SECONDS` is warned about once per process) and reports every environment variable a
plugin changed while loading (`devplug.core.registry.environment`). Every plugin is imported at
start: pluggy registers a plugin by looking at the hooks of the imported object, and whether it is a
device plugin or a device-neutral one is known only from those hooks.

Order is deterministic and documented (docs/plugins.md "Precedence"): the core fallback, the
built-ins, then third-party plugins sorted by distribution and plugin name (registered in reverse, so
pluggy, which calls the last registered first, calls them in that order), then plugins passed at run
time. A device name two plugins declare stays with a plugin named in ``DEVPLUG_PREFER_PLUGINS``, else
with the built-in, else with the first in that order; the other plugin's clashing device is
skipped and reported as a `DeviceConflict`, and every other device keeps working. A
declaration marked ``DeviceSpec.generic`` (the built-in ``generic`` plugin's) yields its name to any
other plugin's without a conflict.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import logging
import os
import re
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import attrs
import pluggy

from devplug.core.contract import hookspecs
from devplug.core.contract.records import DeviceSpec
from devplug.core.contract.versions import contract_problem
from devplug.core.errors import ConfigError, PluginError
from devplug.core.fallback import plugin as fallback
from devplug.core.registry import environment
from devplug.core.registry.guard import guard_hookimpl

log = logging.getLogger("devplug")

ENTRY_POINT_GROUP = "devplug"
ENV_DISABLE_AUTOLOAD = "DEVPLUG_DISABLE_PLUGIN_AUTOLOAD"
ENV_BLOCK = "DEVPLUG_BLOCK_PLUGINS"
ENV_PREFER = "DEVPLUG_PREFER_PLUGINS"
BUILTIN_DISTRIBUTION = "devplug (built-in)"
RUNTIME_DISTRIBUTION = "registered at run time"
FALLBACK_NAME = "devplug.fallback"

#: Built-in device plugins: (plugin name, implementation module), loaded through the same path as entry points.
BUILTIN_PLUGINS: tuple[tuple[str, str], ...] = (
    ("cpu", "devplug.plugins.cpu.plugin"),
    ("cuda", "devplug.plugins.cuda.plugin"),
    ("hpu", "devplug.plugins.hpu.plugin"),
    ("generic", "devplug.plugins.generic.plugin"),
)

#: A third-party plugin whose import takes longer (seconds) is reported once per process.
SLOW_IMPORT_SECONDS = 1.0
_warned_slow: set[tuple[str, str]] = set()

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"", "0", "false", "no", "off"})


def env_flag(name: str, environ: Mapping[str, str] | None = None) -> bool:
    """A boolean environment variable: 1/true/yes/on or 0/false/no/off (any case); unset is False.

    Anything else is a `ConfigError` naming the variable and the accepted spellings.
    """
    raw = (os.environ if environ is None else environ).get(name, "")
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigError(f"{name}={raw!r} is not a yes/no value; use 1, true, yes, on or 0, false, no, off")


def names_from_env(name: str, environ: Mapping[str, str] | None = None) -> list[str]:
    """Plugin names in a comma-separated environment variable, lower-cased (names match in any case)."""
    raw = (os.environ if environ is None else environ).get(name, "")
    return [n.strip().lower() for n in raw.split(",") if n.strip()]


@attrs.frozen
class PluginSource:
    """Where a plugin comes from, before it is imported."""

    name: str
    distribution: str
    load: Callable[[], Any]


@attrs.frozen
class PluginFailure:
    """A plugin that could not be loaded: its name, distribution, and what went wrong."""

    name: str
    distribution: str
    error: str

    def __str__(self) -> str:
        return f"plugin {self.name!r} from {self.distribution} was skipped: {self.error}"


@attrs.frozen
class DeclaredDevice:
    """A device a plugin declared, with the plugin and its distribution."""

    spec: DeviceSpec
    plugin_name: str
    distribution: str


@attrs.frozen
class DeviceConflict:
    """Two plugins declared the same device name: which one keeps it, which device was skipped, and why."""

    kept: DeclaredDevice
    skipped: DeclaredDevice
    why: str

    def __str__(self) -> str:
        kept, skipped = self.kept, self.skipped
        return (
            f"device {kept.spec.name!r} is declared by plugin {kept.plugin_name!r} ({kept.distribution}) and by "
            f"plugin {skipped.plugin_name!r} ({skipped.distribution}); {kept.plugin_name!r} keeps it ({self.why}). "
            f"To use the other: {ENV_PREFER}={skipped.plugin_name}, or {ENV_BLOCK}={kept.plugin_name}"
        )


class DevplugPluginManager(pluggy.PluginManager):
    """pluggy's manager for the ``devplug`` project: distributions, failures, devices and conflicts."""

    def __init__(self) -> None:
        super().__init__(hookspecs.PROJECT)
        self.add_hookspecs(hookspecs)
        self.distributions: dict[str, str] = {}
        self.failures: list[PluginFailure] = []
        self.blocked_names: set[str] = set()
        self.preferred: tuple[str, ...] = ()
        self.warnings: list[str] = []
        self.autoload = True
        #: Seconds each plugin loaded through `add_plugin` took to import, by plugin name.
        self.import_seconds: dict[str, float] = {}
        #: Environment variables the plugins changed while loading, in load order.
        self.environment_changes: list[environment.EnvironmentChange] = []
        self._declared: dict[str, tuple[DeviceSpec, ...]] = {}
        self._kind_known: set[str] = set()

    # ---- registration ---------------------------------------------------------------------------------
    def register(self, plugin: Any, name: str | None = None) -> str | None:
        """pluggy's register, then every hook implementation of the plugin guarded (see `.guard`).

        A hook implementation pluggy refuses (an argument its hook does not have, ``wrapper=True`` on a
        function that does not yield) is a `PluginError` in one line saying what the hook takes.
        """
        try:
            plugin_name = super().register(plugin, name)
        except pluggy.PluginValidationError as exc:
            raise PluginError(self._refused_signature(exc)) from None
        if plugin_name is not None:
            distribution = self.distribution_of(plugin_name)
            for caller in self.get_hookcallers(plugin) or []:
                for impl in caller.get_hookimpls():
                    if impl.plugin is plugin:
                        guard_hookimpl(impl, caller.spec, distribution)
        return plugin_name

    def _refused_signature(self, exc: pluggy.PluginValidationError) -> str:
        """pluggy's several-line refusal of a hook implementation, in one line with what the hook takes."""
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        found = re.search(r"for hook '(\w+)'", lines[0]) if lines else None
        spec = getattr(getattr(self.hook, found.group(1), None), "spec", None) if found else None
        if spec is None:
            return "; ".join(lines)
        hook = spec.name
        arguments = ", ".join(spec.argnames) or "no arguments"
        unknown = re.search(r"Argument\(s\) \{(.*)\} are declared in the hookimpl", str(exc))
        if unknown:
            names = unknown.group(1).replace("'", "")
            return (f"its {hook} takes {names}, which the hook does not have; {hook} takes {arguments} (an "
                    f"implementation may leave out the ones it does not use, but not rename or add any; see "
                    f"docs/hooks.md#{hook})")
        return f"its {hook} was refused by pluggy: {'; '.join(lines[2:] or lines)} (see docs/hooks.md#{hook})"

    def distribution_of(self, plugin_name: str) -> str:
        """The distribution a registered plugin came from (``"devplug (built-in)"`` for ours)."""
        return self.distributions.get(plugin_name, RUNTIME_DISTRIBUTION)

    def is_blocked_name(self, name: str) -> bool:
        """True when ``name`` is blocked (names match in any case)."""
        return name.lower() in self.blocked_names

    def add_plugin(self, source: PluginSource) -> bool:
        """Import, validate, register and (for a device plugin) declare one plugin; on failure record it."""
        if self.is_blocked_name(source.name):
            log.debug("devplug plugin %r is blocked", source.name)
            return False
        before = environment.snapshot()
        plugin: Any = None
        try:
            self._refuse_taken_name(source.name)
            started = time.perf_counter()
            plugin = source.load()
            self._timed(source, time.perf_counter() - started)
            problem = contract_problem(getattr(plugin, "DEVPLUG_CONTRACT", None))
            if problem is not None:
                raise PluginError(problem)
            if self.is_registered(plugin):
                other = self.get_name(plugin) or "?"
                raise PluginError(f"it is the plugin already loaded as {other!r} ({self.distribution_of(other)})")
            self.distributions[source.name] = source.distribution
            self.register(plugin, name=source.name)
            self._check_pending_names(plugin)
            self._declare(source.name, plugin)
        except (Exception, SystemExit) as exc:  # a third party's bug (or sys.exit) must not take devplug down
            if plugin is not None and self.get_plugin(source.name) is plugin:  # pluggy may keep a plugin it refused
                self.unregister(name=source.name)
            self.record_failure(source.name, source.distribution, exc)
            return False
        finally:
            self._environment_changed(source, before)
        return True

    def _refuse_taken_name(self, name: str) -> None:
        """A `PluginError` when a plugin of that name is loaded already (it keeps its name and keeps working)."""
        if self.get_plugin(name) is not None:
            raise PluginError(f"a plugin named {name!r} is loaded already, from {self.distribution_of(name)}; "
                              "plugin names must be unique: rename this one")

    def _check_pending_names(self, plugin: Any) -> None:
        """pluggy's ``check_pending``; a hook name devplug does not know is refused with the closest it does."""
        try:
            self.check_pending()
        except pluggy.PluginValidationError:
            known = sorted(name for name in dir(self.hook)
                           if name.startswith("devplug_") and getattr(self.hook, name).spec is not None)
            unknown = sorted(caller.name for caller in self.get_hookcallers(plugin) or [] if caller.spec is None)
            if not unknown:
                raise
            hints = []
            for name in unknown:
                close = difflib.get_close_matches(name, known, n=1, cutoff=0.7)
                hints.append(f"{name} (did you mean {close[0]}?)" if close else name)
            raise PluginError(f"it implements {', '.join(hints)}, which devplug's hook contract does not have; "
                              "docs/hooks.md lists the hooks") from None

    def _timed(self, source: PluginSource, took: float) -> None:
        """Keep how long the plugin took to import; warn (once per process) when a third party's was slow.

        Plugins passed at run time are objects already: nothing is imported, nothing is kept.
        """
        if source.distribution == RUNTIME_DISTRIBUTION:
            return
        self.import_seconds[source.name] = took
        if took <= SLOW_IMPORT_SECONDS or source.distribution == BUILTIN_DISTRIBUTION:
            return
        message = (f"plugin {source.name!r} ({source.distribution}) took {took:.1f} s to import, and every devplug "
                   "process pays it (plugins are imported to find their hooks); `devplug devices --verbose` shows "
                   f"each plugin's import time; {ENV_BLOCK}={source.name} skips it")
        self.warnings.append(message)
        key = (source.name, source.distribution)
        if key not in _warned_slow:
            _warned_slow.add(key)
            log.warning("%s", message)

    def _environment_changed(self, source: PluginSource, before: dict[str, str]) -> None:
        """Record and report the environment variables the plugin changed while loading."""
        changes = environment.changes_between(before, environment.snapshot(), source.name, source.distribution)
        if not changes:
            return
        environment.record(changes)
        self.environment_changes += changes
        message = (f"plugin {source.name!r} ({source.distribution}) changed the environment of this process while "
                   f"loading: {'; '.join(change.describe() for change in changes)}")
        self.warnings.append(message)
        log.warning("%s", message)

    def record_failure(self, name: str, distribution: str, exc: BaseException) -> PluginFailure:
        """Remember (and log once) that plugin ``name`` was skipped because of ``exc``."""
        if isinstance(exc, SystemExit):
            error = f"it called sys.exit({exc.code!r}) while loading"
        else:
            error = str(exc) if isinstance(exc, PluginError) else f"{type(exc).__name__}: {exc}"
        failure = PluginFailure(name, distribution, error)
        self.failures.append(failure)
        if self.get_plugin(name) is None:  # a loaded plugin of the same name keeps its distribution
            self.distributions.pop(name, None)
        log.warning("%s", failure)
        return failure

    # ---- devices --------------------------------------------------------------------------------------
    def _declare(self, name: str, plugin: Any) -> None:
        """Ask a plugin that implements ``devplug_register_devices`` for its devices (its kind is static)."""
        self._kind_known.add(name)
        impls = [
            impl
            for impl in self.hook.devplug_register_devices.get_hookimpls()
            if impl.plugin is plugin and not (impl.wrapper or impl.hookwrapper)
        ]
        if not impls:
            return  # a device-neutral plugin
        label = f"devplug_register_devices of plugin {name!r} ({self.distribution_of(name)})"
        self._declared[name] = _as_specs(impls[0].function(), label)

    def declared_devices(self) -> dict[str, tuple[DeviceSpec, ...]]:
        """Devices each device plugin declared, by plugin name (plugins registered directly are asked now)."""
        for impl in self.hook.devplug_register_devices.get_hookimpls():
            name = impl.plugin_name
            if name in self._kind_known or impl.wrapper or impl.hookwrapper:
                continue
            try:
                self._declare(name, impl.plugin)
            except Exception as exc:
                self.unregister(name=name)
                self.record_failure(name, self.distribution_of(name), exc)
        live = {name for name, _ in self.list_name_plugin()}
        return {name: specs for name, specs in self._declared.items() if name in live}

    def _precedence(self, name: str) -> tuple[int, int]:
        order = [n for n, _ in self.list_name_plugin()]
        if name.lower() in self.preferred:
            return (0, self.preferred.index(name.lower()))
        if self.distribution_of(name) == BUILTIN_DISTRIBUTION:
            return (1, order.index(name))
        return (2, -order.index(name))  # third-party: registered in reverse of their documented order

    def device_table(self) -> tuple[list[DeclaredDevice], list[DeviceConflict]]:
        """Every device with the plugin that keeps its name, and the conflicts that were resolved.

        Declarations marked ``DeviceSpec.generic`` come after all others: one whose name another
        plugin declares without ``generic`` is left out silently (the dedicated plugin serves it).
        """
        kept: dict[str, DeclaredDevice] = {}
        conflicts: list[DeviceConflict] = []
        declared = self.declared_devices()
        ordered = [(name, spec) for name in sorted(declared, key=self._precedence) for spec in declared[name]]
        for generic in (False, True):
            for plugin_name, spec in ordered:
                if spec.generic is not generic:
                    continue
                entry = DeclaredDevice(spec, plugin_name, self.distribution_of(plugin_name))
                owner = kept.get(spec.name)
                if owner is None:
                    kept[spec.name] = entry
                elif owner.spec.generic is generic:
                    conflicts.append(DeviceConflict(owner, entry, self._why_kept(owner.plugin_name)))
        return list(kept.values()), conflicts

    def _why_kept(self, plugin_name: str) -> str:
        rank = self._precedence(plugin_name)[0]
        return (f"preferred by {ENV_PREFER}", "a built-in keeps its names",
                "first in order of distribution and plugin name")[rank]


def _as_specs(answer: Any, label: str) -> tuple[DeviceSpec, ...]:
    """The DeviceSpecs a registration answer holds, or a PluginError saying what was wrong with it."""
    if answer is None:
        raise PluginError(
            f"{label} returned None: a plugin that implements devplug_register_devices is a device plugin and "
            "declares its devices on every machine (report a missing runtime through DeviceSpec.probe with "
            "Availability.no(reason, fix)); a device-neutral plugin does not implement this hook"
        )
    if isinstance(answer, DeviceSpec):
        return _as_specs([answer], label)
    if isinstance(answer, (str, bytes)) or not isinstance(answer, Iterable):
        raise PluginError(f"{label} returned {answer!r} (a {type(answer).__name__}), not a devplug.DeviceSpec; "
                          "return DeviceSpec(name=..., description=..., priority=..., probe=...) or a list of them")
    specs = tuple(answer)
    for spec in specs:
        if not isinstance(spec, DeviceSpec):
            raise PluginError(f"{label} returned {spec!r} (a {type(spec).__name__}) among its devices; "
                              "every item must be a devplug.DeviceSpec")
    if not specs:
        return _as_specs(None, label)
    for spec in specs:
        if isinstance(spec.priority, bool) or not isinstance(spec.priority, int):
            raise PluginError(f"{label} declared device {spec.name!r} with priority {spec.priority!r} (a "
                              f"{type(spec.priority).__name__}); DeviceSpec.priority is an int (higher wins 'auto')")
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise PluginError(f"{label} declared the same device name twice: {names}")
    return specs


def _import_builtin(module: str) -> Callable[[], Any]:
    return lambda: importlib.import_module(module)


def _already_loaded(obj: Any) -> Callable[[], Any]:
    return lambda: obj


def builtin_sources() -> list[PluginSource]:
    """The built-in device plugins as plugin sources."""
    return [PluginSource(name, BUILTIN_DISTRIBUTION, _import_builtin(mod)) for name, mod in BUILTIN_PLUGINS]


def entry_point_sources() -> list[PluginSource]:
    """Third-party plugins under the ``devplug`` entry-point group, sorted by distribution then plugin name.

    The order does not depend on ``sys.path`` (where each distribution happens to be installed).
    """
    sources = []
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = f"{ep.dist.name} {ep.dist.version}" if ep.dist is not None else "unknown distribution"
        sources.append(PluginSource(ep.name, dist, ep.load))
    unique = {(s.distribution.lower(), s.name.lower()): s for s in sources}  # a dist seen twice on sys.path
    return [unique[key] for key in sorted(unique)]


def _check_switches(pm: DevplugPluginManager, known: Iterable[str]) -> None:
    """Warn about blocked or preferred names that match no plugin, and refuse to block the core fallback."""
    known_names = sorted({n.lower() for n in known})
    if FALLBACK_NAME in pm.blocked_names:
        pm.blocked_names.discard(FALLBACK_NAME)
        pm.warnings.append(f"{ENV_BLOCK}: the core fallback ({FALLBACK_NAME}) cannot be blocked: it answers every "
                           "hook no plugin answers; ignored")
    for variable, names in ((ENV_BLOCK, sorted(pm.blocked_names)), (ENV_PREFER, list(pm.preferred))):
        for name in names:
            if name not in known_names:
                close = difflib.get_close_matches(name, known_names, n=1)
                hint = f"did you mean {close[0]!r}? " if close else ""
                pm.warnings.append(f"{variable} names {name!r}, which is no plugin here; {hint}"
                                   f"known plugins: {', '.join(known_names)}")
    for message in pm.warnings:
        log.warning("%s", message)


def create_plugin_manager(
    *,
    autoload: bool | None = None,
    blocked: Iterable[str] | None = None,
    preferred: Iterable[str] | None = None,
    extra_plugins: Iterable[Any] = (),
) -> DevplugPluginManager:
    """Build a plugin manager with the fallback, built-in, entry-point and extra plugins registered.

    ``autoload`` defaults to True unless ``DEVPLUG_DISABLE_PLUGIN_AUTOLOAD`` is set; ``blocked``
    defaults to ``DEVPLUG_BLOCK_PLUGINS`` and ``preferred`` (plugins that win a device-name clash) to
    ``DEVPLUG_PREFER_PLUGINS``; names match in any case. ``extra_plugins`` (objects, or
    ``(name, object)`` pairs) are registered after the rest, as if they came from an entry point of
    "registered at run time".
    """
    pm = DevplugPluginManager()
    pm.blocked_names = {n.lower() for n in (names_from_env(ENV_BLOCK) if blocked is None else blocked)}
    pm.preferred = tuple(n.lower() for n in (names_from_env(ENV_PREFER) if preferred is None else preferred))
    pm.autoload = not env_flag(ENV_DISABLE_AUTOLOAD) if autoload is None else autoload
    extras: list[PluginSource] = []
    for extra in extra_plugins:
        name, obj = extra if isinstance(extra, tuple) else (getattr(extra, "__name__", None), extra)
        name = name or f"plugin-{id(obj):x}"
        extras.append(PluginSource(name, RUNTIME_DISTRIBUTION, _already_loaded(obj)))
    third_party = entry_point_sources() if pm.autoload else []
    sources = builtin_sources() + third_party[::-1] + extras
    _check_switches(pm, [FALLBACK_NAME] + [s.name for s in sources])
    pm.distributions[FALLBACK_NAME] = BUILTIN_DISTRIBUTION
    pm.register(fallback, name=FALLBACK_NAME)
    for source in sources:
        pm.add_plugin(source)
    for conflict in pm.device_table()[1]:
        log.warning("%s", conflict)
    return pm


_default: DevplugPluginManager | None = None


def get_plugin_manager() -> DevplugPluginManager:
    """The process-wide plugin manager, created on first use from the environment."""
    global _default
    if _default is None:
        _default = create_plugin_manager()
    return _default


def reset_plugin_manager() -> None:
    """Forget the process-wide manager (tests, or after installing a plugin at run time)."""
    global _default
    _default = None
