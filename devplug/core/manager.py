"""Plugin loading: built-ins and entry points through one path, failures reported and skipped.

A plugin is any object (usually a module) with ``@devplug.hookimpl`` functions. Built-in plugins and
third-party ones registered under the ``devplug`` entry-point group are loaded the same way:
imported, checked against the contract version, registered with pluggy (which validates hook
signatures) and checked for unknown hooks. A plugin that fails any step is recorded as a
:class:`PluginFailure` with its distribution and the error, logged once, and left out; the rest
keep working.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import os
from collections.abc import Callable, Iterable
from typing import Any

import attrs
import pluggy

from devplug.core import fallback, hookspecs
from devplug.core.records import CONTRACT_VERSION

log = logging.getLogger("devplug")

ENTRY_POINT_GROUP = "devplug"
ENV_DISABLE_AUTOLOAD = "DEVPLUG_DISABLE_PLUGIN_AUTOLOAD"
ENV_BLOCK = "DEVPLUG_BLOCK_PLUGINS"
BUILTIN_DISTRIBUTION = "devplug (built-in)"

#: Built-in device plugins: (plugin name, module). Registered through the same path as entry points.
BUILTIN_PLUGINS: tuple[tuple[str, str], ...] = (
    ("cpu", "devplug.plugins.cpu"),
    ("cuda", "devplug.plugins.cuda"),
    ("hpu", "devplug.plugins.hpu"),
)


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


class DevplugPluginManager(pluggy.PluginManager):
    """pluggy's manager for the ``devplug`` project, remembering each plugin's distribution."""

    def __init__(self) -> None:
        super().__init__(hookspecs.PROJECT)
        self.add_hookspecs(hookspecs)
        self.distributions: dict[str, str] = {}
        self.failures: list[PluginFailure] = []
        self.blocked_names: set[str] = set()

    def distribution_of(self, plugin_name: str) -> str:
        """The distribution a registered plugin came from (``"devplug (built-in)"`` for ours)."""
        return self.distributions.get(plugin_name, "registered at run time")

    def add_plugin(self, source: PluginSource) -> bool:
        """Import, validate and register one plugin; on failure record it and return False."""
        if source.name in self.blocked_names or self.is_blocked(source.name):
            log.debug("devplug plugin %r is blocked", source.name)
            return False
        try:
            plugin = source.load()
            _check_contract(plugin)
            self.register(plugin, name=source.name)
        except Exception as exc:  # a third party's bug must not take devplug down
            self._record_failure(source, exc)
            return False
        self.distributions[source.name] = source.distribution
        try:
            self.check_pending()
        except pluggy.PluginValidationError as exc:
            self.unregister(name=source.name)
            self._record_failure(source, exc)
            return False
        return True

    def _record_failure(self, source: PluginSource, exc: BaseException) -> None:
        failure = PluginFailure(source.name, source.distribution, f"{type(exc).__name__}: {exc}")
        self.failures.append(failure)
        self.distributions.pop(source.name, None)
        log.warning("%s", failure)


def _check_contract(plugin: Any) -> None:
    declared = getattr(plugin, "DEVPLUG_CONTRACT", None)
    if declared is None:
        return
    major = str(declared).split(".")[0]
    if major != CONTRACT_VERSION.split(".")[0]:
        raise pluggy.PluginValidationError(
            plugin,
            f"it declares hook contract {declared!r} but this devplug speaks {CONTRACT_VERSION!r}; "
            "install a plugin release built for this devplug version",
        )


def _import_builtin(module: str) -> Callable[[], Any]:
    return lambda: importlib.import_module(module)


def builtin_sources() -> list[PluginSource]:
    """The built-in device plugins as plugin sources."""
    return [PluginSource(name, BUILTIN_DISTRIBUTION, _import_builtin(mod)) for name, mod in BUILTIN_PLUGINS]


def entry_point_sources() -> list[PluginSource]:
    """Third-party plugins registered under the ``devplug`` entry-point group."""
    sources = []
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = f"{ep.dist.name} {ep.dist.version}" if ep.dist is not None else "unknown distribution"
        sources.append(PluginSource(ep.name, dist, ep.load))
    return sources


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no")


def blocked_from_env() -> set[str]:
    """Plugin names listed in ``DEVPLUG_BLOCK_PLUGINS`` (comma-separated)."""
    return {n.strip() for n in os.environ.get(ENV_BLOCK, "").split(",") if n.strip()}


def create_plugin_manager(
    *,
    autoload: bool | None = None,
    blocked: Iterable[str] | None = None,
    extra_plugins: Iterable[Any] = (),
) -> DevplugPluginManager:
    """Build a plugin manager with the fallback, built-in, entry-point and extra plugins registered.

    ``autoload`` defaults to True unless ``DEVPLUG_DISABLE_PLUGIN_AUTOLOAD`` is set; ``blocked``
    defaults to ``DEVPLUG_BLOCK_PLUGINS``. ``extra_plugins`` (objects, or ``(name, object)`` pairs)
    are registered after the rest, as if they came from an entry point of "registered at run time".
    """
    pm = DevplugPluginManager()
    pm.blocked_names = set(blocked_from_env() if blocked is None else blocked)
    for name in pm.blocked_names:
        pm.set_blocked(name)
    pm.register(fallback, name="devplug.fallback")
    pm.distributions["devplug.fallback"] = BUILTIN_DISTRIBUTION
    if autoload is None:
        autoload = not _env_flag(ENV_DISABLE_AUTOLOAD)
    sources = builtin_sources()
    if autoload:
        sources += entry_point_sources()
    for source in sources:
        pm.add_plugin(source)
    for extra in extra_plugins:
        name, obj = extra if isinstance(extra, tuple) else (getattr(extra, "__name__", None), extra)
        name = name or f"plugin-{id(obj):x}"
        pm.add_plugin(PluginSource(name, "registered at run time", lambda obj=obj: obj))
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
