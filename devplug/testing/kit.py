"""The conformance kit's machinery: the check registry, the device under test, and what the checks share.

A check is a ``check_<name>`` function in one of the area modules of `devplug.testing.checks`,
registered with `conformance_check` as the check of the hooks it covers. It takes a
`DeviceUnderTest`, exercises one part of the hook contract exactly the way devplug's core uses
it, and either returns a short description of what it saw or raises `ConformanceError` (an
``AssertionError``) naming the device, the plugin, its distribution and what to change. A check that
cannot run here (the device is not available on this machine, ``torch.distributed`` is missing)
raises `NotApplicable` instead.

Each check names the contract version that introduced what it checks (``since``). A plugin is held to
the contract it declares (``DEVPLUG_CONTRACT``): a check introduced in a later minor version still runs
for it, but its failure is advisory, because a plugin written for 1.0 keeps working with every later 1.x.

This module imports no check: `devplug.testing.checks` imports them all, so ask it, not
`CHECKS`, for the complete list.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

import attrs
import torch
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from devplug.core.contract import hookspecs
from devplug.core.contract.records import CONTRACT_VERSION, Availability, Device
from devplug.core.errors import PluginError
from devplug.core.registry.devices import DeviceHooks, DeviceRegistry, RegisteredDevice
from devplug.core.registry.manager import DevplugPluginManager, create_plugin_manager

if TYPE_CHECKING:
    from devplug.core.loop.trainer import Trainer

P = ParamSpec("P")
R = TypeVar("R")

#: Optimizer names every device must build (the hook may defer some to the core's fallback).
STANDARD_OPTIMIZERS = ("adam", "adamw", "sgd")
"""The optimizer names every device plugin must build (the kit checks each one)."""


def selection_cases(value: Any) -> list[Any]:
    """The cases of a selection (``optimizer_names``, ``precisions``): one name given as a string is one case,
    not a case per character."""
    return [value] if isinstance(value, str) else list(value)


class ConformanceError(AssertionError):
    """A plugin does not keep the hook contract; the message says where and what to change."""


class NotApplicable(Exception):
    """A check cannot run on this machine (for example the device is not available here)."""


class DoesNotApply(NotApplicable):
    """A check has nothing to check in what the plugin offers (the canonical state of an algorithm torch.optim does
    not have), wherever it runs: not applicable even where the device must be available (``require_available``)."""


# ---- the registry ----------------------------------------------------------------------------------------
@attrs.frozen
class CheckSpec:
    """One conformance check: the hooks it covers, what it is parametrised over, what it needs.

    ``over`` names a selection (``"optimizer_names"``, ``"precisions"``, ``"phases"``) with one case per
    value; ``options`` maps a keyword argument of the check to a selection value (``run`` →
    ``run_compiled``); ``needs_device`` is False for checks that run without the device available;
    ``since`` is the contract version that introduced what the check asks for (a plugin declaring an
    older contract gets an advisory result, not a failure).
    """

    name: str
    function: Callable[..., str]
    hooks: tuple[str, ...]
    over: str | None = None
    options: Mapping[str, str] = attrs.field(factory=dict)
    needs_device: bool = True
    since: str = "1.0"

    @property
    def position(self) -> int:
        """Order in the kit: the contract's order of the first hook covered; end-to-end checks last."""
        order = [fn.__name__ for fn in hookspecs.HOOKS]
        return min((order.index(h) for h in self.hooks), default=len(order))


#: Every check, in registration order (`registered_checks` gives them in the kit's order).
CHECKS: list[CheckSpec] = []


def conformance_check(*hooks: str, over: str | None = None, options: Mapping[str, str] | None = None,
                      needs_device: bool = True,
                      since: str = "1.0") -> Callable[[Callable[..., str]], Callable[..., str]]:
    """Register a ``check_<name>`` function as the check of ``hooks`` (none: an end-to-end check).

    ``since``: the contract version that introduced what the check asks for (default ``"1.0"``).
    """
    unknown = set(hooks) - {fn.__name__ for fn in hookspecs.HOOKS}
    if unknown:
        raise ValueError(f"conformance_check names unknown hooks {sorted(unknown)}")
    if Version(since) > Version(CONTRACT_VERSION):
        raise ValueError(f"conformance_check(since={since!r}) is newer than the contract {CONTRACT_VERSION}")

    def register(function: Callable[..., str]) -> Callable[..., str]:
        name = function.__name__.removeprefix("check_")
        CHECKS.append(CheckSpec(name, function, hooks, over, dict(options or {}), needs_device, since))
        return function

    return register


def registered_checks() -> list[CheckSpec]:
    """The registered checks in the kit's order: the contract's hooks in order, end-to-end checks last.

    Checks of the same hook keep their registration order.
    """
    return sorted(CHECKS, key=lambda spec: spec.position)


def uncovered_hooks() -> list[str]:
    """Hooks of the contract that no registered check covers (a new hook needs its check)."""
    covered = {h for spec in CHECKS for h in spec.hooks}
    return [fn.__name__ for fn in hookspecs.HOOKS if fn.__name__ not in covered]


# ---- the device under test -------------------------------------------------------------------------------
class KitHooks(DeviceHooks):
    """Hooks routed as a Trainer routes them; a contract violation the core detects fails the check."""

    def __init__(self, registry: DeviceRegistry, device: Device, label: str) -> None:
        super().__init__(registry, device)
        self.label = label

    def __call__(self, spec: Callable[Concatenate[Device, P], R], /, *args: P.args, **kwargs: P.kwargs) -> R:
        """Call the hook ``spec``; a `devplug.PluginError` becomes a `ConformanceError`."""
        try:
            return super().__call__(spec, *args, **kwargs)
        except PluginError as exc:
            raise ConformanceError(f"{self.label}: {exc}") from exc


@attrs.define
class DeviceUnderTest:
    """A device name with the plugin manager, registry entry and (once available) routed hooks to test."""

    name: str
    plugin_manager: DevplugPluginManager
    registry: DeviceRegistry
    entry: RegisteredDevice
    options: Mapping[str, Any] = attrs.field(factory=dict)
    _device: Device | None = attrs.field(default=None, alias="_device")
    _hooks: DeviceHooks | None = attrs.field(default=None, alias="_hooks")

    @property
    def label(self) -> str:
        """``device 'x' (plugin 'p' from dist 1.0)``, the prefix of every message."""
        return f"device {self.name!r} (plugin {self.entry.plugin_name!r} from {self.entry.distribution})"

    @property
    def availability(self) -> Availability:
        """The probe's answer, as devplug sees it (a raising probe reads as unavailable)."""
        return self.entry.availability()

    @property
    def contract(self) -> str:
        """The contract version the device's plugin is held to: the ``MAJOR.MINOR`` it declares.

        A range (``">=1.0,<3"``) promises every contract in it, this devplug's among them, and a plugin
        that declares nothing is assumed current: both are held to `devplug.CONTRACT_VERSION`.
        """
        return declared_contract(self.plugin_manager.get_plugin(self.entry.plugin_name))

    def holds_to(self, since: str) -> bool:
        """Whether the plugin must pass a check introduced in contract ``since`` (else the check is advisory)."""
        return Version(self.contract) >= Version(since)

    def require_available(self) -> None:
        """Raise `NotApplicable` when the device cannot be used on this machine."""
        availability = self.availability
        if not availability.available:
            raise NotApplicable(f"{self.label} is not available here: {availability.reason}")

    @property
    def device(self) -> Device:
        """The resolved `Device` (resolution runs on first use)."""
        if self._device is None:
            self.require_available()
            self._device = self.registry.resolve(self.name, options=self.options)
        return self._device

    @property
    def hooks(self) -> DeviceHooks:
        """Operational hooks routed as a Trainer routes them; ``devplug_device_setup`` has run once."""
        if self._hooks is None:
            hooks = KitHooks(self.registry, self.device, self.label)
            hooks(hookspecs.devplug_device_setup)
            self._hooks = hooks
        return self._hooks

    def fail(self, message: str) -> ConformanceError:
        """A `ConformanceError` about this device (raise it)."""
        return ConformanceError(f"{self.label}: {message}")

    def trainer(self, **options: Any) -> Trainer:
        """A `devplug.Trainer` on this device with this plugin manager (no progress bar)."""
        from devplug.core.loop.trainer import Trainer

        options.setdefault("progress", False)
        options.setdefault("device_options", dict(self.options))
        return Trainer(device=self.name, plugin_manager=self.plugin_manager, **options)


def open_device(
    name: str,
    plugin_manager: DevplugPluginManager | None = None,
    *,
    options: Mapping[str, Any] | None = None,
) -> DeviceUnderTest:
    """Find device ``name`` among the plugins ``plugin_manager`` loaded (default: a fresh manager).

    Raises `ConformanceError` when no plugin registers the name, listing what went wrong while
    loading plugins (the usual reason: the plugin failed to import or was rejected).
    """
    pm = plugin_manager if plugin_manager is not None else create_plugin_manager()
    registry = DeviceRegistry(pm)
    entry = registry.devices.get(name)
    if entry is None:
        failures = "; ".join(str(f) for f in pm.failures) or "none"
        raise ConformanceError(
            f"no loaded plugin registers device {name!r}. Registered devices: "
            f"{', '.join(registry.names()) or 'none'}. Plugin load failures: {failures}. Is the plugin "
            "installed (pip install -e .) with an entry point in the 'devplug' group, and not blocked?"
        )
    return DeviceUnderTest(name=name, plugin_manager=pm, registry=registry, entry=entry, options=dict(options or {}))


def declared_contract(plugin: object) -> str:
    """The contract version ``plugin`` is held to (see `DeviceUnderTest.contract`)."""
    declared = getattr(plugin, "DEVPLUG_CONTRACT", None)
    if declared is None:
        return CONTRACT_VERSION
    text = str(declared).strip()
    try:
        if any(op in text for op in "<>=!~,"):
            SpecifierSet(text)
            return CONTRACT_VERSION
        version = Version(text)
    except (InvalidSpecifier, InvalidVersion):
        return CONTRACT_VERSION
    current = Version(CONTRACT_VERSION)
    if version.major != current.major or version > current:
        return CONTRACT_VERSION  # the manager does not load such a plugin; hold it to the current contract
    return f"{version.major}.{version.minor}"


# ---- what several checks share ---------------------------------------------------------------------------
def on_device(tensor: torch.Tensor, device: Device) -> bool:
    """Whether ``tensor`` lives on ``device`` (any index of its type when the device names none)."""
    target = device.torch_device
    if tensor.device.type != target.type:
        return False
    return target.index is None or tensor.device.index == target.index


def tensors_in(obj: object) -> Iterator[torch.Tensor]:
    """Every tensor in ``obj``, a tensor or mappings, lists and tuples of them (other leaves skipped)."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, Mapping):
        for value in obj.values():
            yield from tensors_in(value)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            yield from tensors_in(value)


def toy_regression(n: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` samples of a fixed linear map of 4 inputs, the same on every call: a convex loss to lower."""
    generator = torch.Generator().manual_seed(1234)
    x = torch.randn(n, 4, generator=generator)
    w = torch.tensor([[1.5], [-2.0], [0.5], [3.0]])
    return x, x @ w + 0.25


def author_options(name: str) -> dict[str, Any]:
    """Options an author passes to optimizer ``name``, none of them the default (so an ignored one shows)."""
    options: dict[str, Any] = {"lr": 0.05}
    if name in ("adam", "adamw"):
        options["betas"] = (0.5, 0.999)
    elif name == "sgd":
        options["momentum"] = 0.9
    return options
