"""The conformance checks, as plain functions (no pytest needed).

Each ``check_*`` function takes a :class:`DeviceUnderTest`, exercises one part of the hook contract
exactly the way devplug's core uses it, and either returns a short description of what it saw or
raises :class:`ConformanceError` (an ``AssertionError``) naming the device, the plugin, its
distribution and what to change. A check that cannot run here (the device is not available on this
machine, ``torch.distributed`` is missing) raises :class:`NotApplicable` instead.

:func:`run_checks` runs them all and returns a list of :class:`CheckResult`; the pytest base class
:class:`devplug.testing.DeviceConformance` runs each as its own test.
"""

from __future__ import annotations

import collections
import inspect
import math
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import torch

from devplug.core.contract import hookspecs
from devplug.core.contract.records import (
    CONTRACT_VERSION,
    PRECISIONS,
    Availability,
    CollectiveSetup,
    Device,
    DoctorReport,
    LaunchInfo,
    LoaderChoice,
    LoaderOptions,
    LogPoint,
    MemoryStats,
    OptimizerChoice,
    PeakFlops,
    Phase,
    PrecisionPlan,
)
from devplug.core.contract.versions import contract_problem
from devplug.core.errors import DevplugError, PluginError, PrecisionError
from devplug.core.registry.devices import DeviceHooks, DeviceRegistry, RegisteredDevice
from devplug.core.registry.manager import BUILTIN_DISTRIBUTION, DevplugPluginManager, create_plugin_manager

#: Optimizer names every device must build (the hook may defer some to the core's fallback).
STANDARD_OPTIMIZERS = ("adam", "adamw", "sgd")
#: Regions the Trainer opens around the step.
REGIONS = ("forward", "backward", "optimizer_step", "data_wait")
_BatchTuple = collections.namedtuple("_BatchTuple", "inputs targets")


class ConformanceError(AssertionError):
    """A plugin does not keep the hook contract; the message says where and what to change."""


class NotApplicable(Exception):
    """A check cannot run on this machine (for example the device is not available here)."""


@attrs.frozen
class CheckSpec:
    """One conformance check: the hooks it covers, what it is parametrised over, what it needs.

    ``over`` names a selection (``"optimizer_names"``, ``"precisions"``, ``"phases"``) with one case per
    value; ``options`` maps a keyword argument of the check to a selection value (``run`` →
    ``run_compiled``); ``needs_device`` is False for checks that run without the device available.
    """

    name: str
    function: Callable[..., str]
    hooks: tuple[str, ...]
    over: str | None = None
    options: Mapping[str, str] = attrs.field(factory=dict)
    needs_device: bool = True

    @property
    def position(self) -> int:
        """Order in the kit: the contract's order of the first hook covered; end-to-end checks last."""
        order = [fn.__name__ for fn in hookspecs.HOOKS]
        return min((order.index(h) for h in self.hooks), default=len(order))


#: Every check, registered by :func:`conformance_check` in definition order.
CHECKS: list[CheckSpec] = []


def conformance_check(*hooks: str, over: str | None = None, options: Mapping[str, str] | None = None,
                      needs_device: bool = True) -> Callable[[Callable[..., str]], Callable[..., str]]:
    """Register a ``check_<name>`` function as the check of ``hooks`` (none: an end-to-end check)."""
    unknown = set(hooks) - {fn.__name__ for fn in hookspecs.HOOKS}
    if unknown:
        raise ValueError(f"conformance_check names unknown hooks {sorted(unknown)}")

    def register(function: Callable[..., str]) -> Callable[..., str]:
        name = function.__name__.removeprefix("check_")
        CHECKS.append(CheckSpec(name, function, hooks, over, dict(options or {}), needs_device))
        return function

    return register


def uncovered_hooks() -> list[str]:
    """Hooks of the contract that no conformance check covers (a new hook needs its check)."""
    covered = {h for spec in CHECKS for h in spec.hooks}
    return [fn.__name__ for fn in hookspecs.HOOKS if fn.__name__ not in covered]


class KitHooks(DeviceHooks):
    """Hooks routed as a Trainer routes them; a contract violation the core detects fails the check."""

    def __init__(self, registry: DeviceRegistry, device: Device, label: str) -> None:
        super().__init__(registry, device)
        self.label = label

    def __call__(self, spec: Any, /, *args: Any, **kwargs: Any) -> Any:
        """Call the hook ``spec``; a :class:`devplug.PluginError` becomes a :class:`ConformanceError`."""
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

    def require_available(self) -> None:
        """Raise :class:`NotApplicable` when the device cannot be used on this machine."""
        availability = self.availability
        if not availability.available:
            raise NotApplicable(f"{self.label} is not available here: {availability.reason}")

    @property
    def device(self) -> Device:
        """The resolved :class:`Device` (resolution runs on first use)."""
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
        """A :class:`ConformanceError` about this device (raise it)."""
        return ConformanceError(f"{self.label}: {message}")

    def trainer(self, **options: Any) -> Any:
        """A :class:`devplug.Trainer` on this device with this plugin manager (no progress bar)."""
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

    Raises :class:`ConformanceError` when no plugin registers the name, listing what went wrong while
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


# ---- helpers -----------------------------------------------------------------------------------------
def _on_device(tensor: torch.Tensor, device: Device) -> bool:
    target = device.torch_device
    if tensor.device.type != target.type:
        return False
    return target.index is None or tensor.device.index == target.index


def _where(obj: Any) -> str:
    return str(obj.device) if isinstance(obj, torch.Tensor) else type(obj).__name__


def _tensors(obj: Any) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, Mapping):
        for value in obj.values():
            yield from _tensors(value)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            yield from _tensors(value)


def _toy_regression(n: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1234)
    x = torch.randn(n, 4, generator=generator)
    w = torch.tensor([[1.5], [-2.0], [0.5], [3.0]])
    return x, x @ w + 0.25


def _plugin_family(dut: DeviceUnderTest) -> list[tuple[str, Any]]:
    """The device plugin and every other plugin shipped in the same (third-party) distribution."""
    pm = dut.plugin_manager
    dist = dut.entry.distribution
    family = [(dut.entry.plugin_name, dut.entry.plugin)]
    if dist != BUILTIN_DISTRIBUTION:
        family += [
            (n, p) for n, p in pm.list_name_plugin() if n != dut.entry.plugin_name and pm.distribution_of(n) == dist
        ]
    return family


# ---- checks --------------------------------------------------------------------------------------------
@conformance_check("devplug_register_devices", needs_device=False)
def check_plugin_loaded(dut: DeviceUnderTest) -> str:
    """The plugin loaded cleanly: no failures from its distribution, a compatible ``DEVPLUG_CONTRACT``
    declared, and no ``devplug_*`` function left without ``@devplug.hookimpl`` (pluggy would ignore it)."""
    pm = dut.plugin_manager
    dist = dut.entry.distribution
    if dist != BUILTIN_DISTRIBUTION:
        failed = [str(f) for f in pm.failures if f.distribution == dist]
        if failed:
            raise dut.fail("other plugins of the same distribution failed to load: " + "; ".join(failed))
    notes = []
    for plugin_name, plugin in _plugin_family(dut):
        declared = getattr(plugin, "DEVPLUG_CONTRACT", None)
        if declared is None:
            raise dut.fail(
                f"plugin {plugin_name!r} does not declare the hook contract it was written for; "
                f'add DEVPLUG_CONTRACT = "{CONTRACT_VERSION}" to its module'
            )
        problem = contract_problem(declared)
        if problem is not None:  # pragma: no cover - the loader rejects such a plugin first
            raise dut.fail(f"plugin {plugin_name!r}: {problem}")
        unmarked = [
            attr
            for attr in dir(plugin)
            if attr.startswith("devplug_")
            and callable(getattr(plugin, attr, None))
            and pm.parse_hookimpl_opts(plugin, attr) is None
        ]
        if unmarked:
            raise dut.fail(
                f"plugin {plugin_name!r} defines {', '.join(unmarked)} without @devplug.hookimpl, so devplug "
                "never calls it; decorate it (or rename it if it is a helper)"
            )
        notes.append(f"{plugin_name} (contract {declared})")
    return "loaded: " + ", ".join(notes)


@conformance_check("devplug_register_devices", needs_device=False)
def check_probe(dut: DeviceUnderTest) -> str:
    """The probe returns an :class:`Availability` (never raises); a reason when unavailable; a count."""
    spec = dut.entry.spec
    try:
        answer = spec.probe()
    except Exception as exc:
        raise dut.fail(
            f"its availability probe raised {type(exc).__name__}: {exc}. A probe must not raise: return "
            "devplug.Availability.no(reason, fix) instead"
        ) from exc
    if not isinstance(answer, Availability):
        raise dut.fail(f"its probe returned {answer!r}; return devplug.Availability.yes() or .no(reason, fix)")
    if not answer.available:
        if not answer.reason.strip():
            raise dut.fail("its probe says unavailable without a reason; pass one: Availability.no(reason, fix)")
        return f"unavailable here: {answer.reason}"
    try:
        count = spec.count()
    except Exception as exc:
        raise dut.fail(f"DeviceSpec.count raised {type(exc).__name__}: {exc} on an available device") from exc
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise dut.fail(f"DeviceSpec.count returned {count!r}; an available device must count at least 1")
    if not isinstance(spec.priority, int) or isinstance(spec.priority, bool):
        raise dut.fail(f"DeviceSpec.priority must be an int, got {spec.priority!r}")
    return f"available, count {count}, priority {spec.priority}"


@conformance_check("devplug_device_setup")
def check_device_setup(dut: DeviceUnderTest) -> str:
    """``devplug_device_setup`` runs, and can run again for a second Trainer in the same process."""
    dut.hooks  # noqa: B018 - runs device setup once
    try:
        KitHooks(dut.registry, dut.device, dut.label)(hookspecs.devplug_device_setup)
    except Exception as exc:
        raise dut.fail(f"devplug_device_setup raised {type(exc).__name__}: {exc} when called a second time") from exc
    return f"set up {dut.device} (torch device {dut.device.torch_device})"


@conformance_check("devplug_to_device")
def check_to_device(dut: DeviceUnderTest) -> str:
    """``devplug_to_device`` moves a module (in place), a tensor and a nested batch, keeping structure."""
    hooks, device = dut.hooks, dut.device
    module = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    moved = hooks(hookspecs.devplug_to_device, obj=module)
    if not isinstance(moved, torch.nn.Module):
        raise dut.fail(f"devplug_to_device(module) returned {type(moved).__name__}, not the module")
    stray = [n for n, t in [*moved.named_parameters(), *moved.named_buffers()] if not _on_device(t, device)]
    if stray:
        raise dut.fail(f"devplug_to_device(module) left {', '.join(stray)} off {device.torch_device}")

    tensor = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    out = hooks(hookspecs.devplug_to_device, obj=tensor)
    if not isinstance(out, torch.Tensor) or not _on_device(out, device):
        raise dut.fail(f"devplug_to_device(tensor) returned {_where(out)}, expected a tensor on {device.torch_device}")
    if out.shape != tensor.shape or out.dtype != tensor.dtype or not torch.equal(out.cpu(), tensor):
        raise dut.fail("devplug_to_device(tensor) changed the tensor's values, shape or dtype")

    marker = object()
    batch = {
        "images": torch.ones(2, 3, 4, 4),
        "pair": (torch.zeros(2, dtype=torch.long), [torch.full((1,), 7.0), "label"]),
        "named": _BatchTuple(torch.ones(2, 1), 3),
        "meta": marker,
    }
    out = hooks(hookspecs.devplug_to_device, obj=batch)
    shape_ok = (
        isinstance(out, dict)
        and set(out) == set(batch)
        and isinstance(out["pair"], tuple)
        and isinstance(out["pair"][1], list)
        and isinstance(out["named"], _BatchTuple)
    )
    if not shape_ok:
        raise dut.fail("devplug_to_device(nested batch) did not keep dicts, tuples, lists and namedtuples as they were")
    if out["meta"] is not marker or out["pair"][1][1] != "label" or out["named"].targets != 3:
        raise dut.fail("devplug_to_device(nested batch) changed non-tensor leaves; return them unchanged")
    stray_leaves = [_where(t) for t in _tensors(out) if not _on_device(t, device)]
    if stray_leaves or sum(1 for _ in _tensors(out)) != 4:
        raise dut.fail(f"devplug_to_device(nested batch) left tensors on {', '.join(stray_leaves) or '?'}")
    if out["pair"][0].dtype != torch.long or not torch.equal(out["pair"][1][0].cpu(), torch.full((1,), 7.0)):
        raise dut.fail("devplug_to_device(nested batch) changed tensor values or dtypes")
    _check_channels_last(dut)
    return f"module, tensor and nested batch moved to {device.torch_device}; channels_last honoured"


def _check_channels_last(dut: DeviceUnderTest) -> None:
    """With ``Trainer(channels_last=True)`` conv weights and 4-D batches arrive channels_last."""
    device = attrs.evolve(dut.device, channels_last=True)
    hooks = KitHooks(dut.registry, device, dut.label)
    conv = hooks(hookspecs.devplug_to_device, obj=torch.nn.Conv2d(3, 4, 3))
    images, labels = hooks(hookspecs.devplug_to_device, obj=(torch.ones(2, 3, 5, 5), torch.zeros(2)))
    if not conv.weight.is_contiguous(memory_format=torch.channels_last):
        raise dut.fail("with channels_last=True, devplug_to_device(module) left conv weights in the default layout; "
                       "move modules with memory_format=device.memory_format (devplug.toolkit.move_to does)")
    if not images.is_contiguous(memory_format=torch.channels_last) or labels.dim() != 1:
        raise dut.fail("with channels_last=True, devplug_to_device(batch) did not make 4-D tensors channels_last")


def _author_options(name: str) -> dict[str, Any]:
    options: dict[str, Any] = {"lr": 0.05}
    if name in ("adam", "adamw"):
        options["betas"] = (0.5, 0.999)
    elif name == "sgd":
        options["momentum"] = 0.9
    return options


@conformance_check("devplug_optimizer", over="optimizer_names")
def check_optimizer(dut: DeviceUnderTest, name: str) -> str:
    """``devplug_optimizer`` builds a working ``torch.optim.Optimizer`` for ``name`` honouring the options."""
    hooks = dut.hooks
    torch.manual_seed(0)
    model = hooks(hookspecs.devplug_to_device, obj=torch.nn.Linear(4, 1))
    params = list(model.parameters())
    options = _author_options(name)
    choice = hooks(hookspecs.devplug_optimizer, name=name, params=params, options=dict(options))
    if not isinstance(choice, OptimizerChoice):
        raise dut.fail(f"devplug_optimizer({name!r}) returned {choice!r}, not a devplug.OptimizerChoice")
    optimizer = choice.optimizer
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise dut.fail(f"devplug_optimizer({name!r}) built a {type(optimizer).__name__}, not a torch.optim.Optimizer")
    if not isinstance(choice.implementation, str) or not choice.implementation.strip():
        raise dut.fail(f"devplug_optimizer({name!r}) did not name its implementation (OptimizerChoice.implementation)")
    managed = {id(p) for group in optimizer.param_groups for p in group["params"]}
    if managed != {id(p) for p in params}:
        raise dut.fail(f"{choice.implementation} does not optimize exactly the parameters it was given")
    group = optimizer.param_groups[0]
    for key, value in options.items():
        got = group.get(key)
        if got is None or (tuple(got) if isinstance(value, tuple) else got) != value:
            raise dut.fail(f"{choice.implementation} ignored option {key}={value!r} (param group has {got!r})")
    x, y = (hooks(hookspecs.devplug_to_device, obj=t) for t in _toy_regression(32))
    losses = []
    for _ in range(5):
        loss = torch.nn.functional.mse_loss(model(x), y)
        losses.append(float(loss.detach().cpu()))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    if not all(math.isfinite(v) for v in losses) or not losses[-1] < losses[0]:
        raise dut.fail(f"{choice.implementation} did not lower a convex toy loss in 5 steps: {losses}")
    return choice.implementation + (f" ({choice.reason})" if choice.reason else "")


@conformance_check("devplug_precision", over="precisions")
def check_precision(dut: DeviceUnderTest, precision: str) -> str:
    """``devplug_precision`` returns a consistent plan, or refuses a mixed setting with ``PrecisionError``.

    ``"auto"`` and ``"32-true"`` must always work. A grad scaler belongs only to ``"16-mixed"``; the
    autocast context, the optional optimizer-step context and module conversion must all work.
    """
    hooks = dut.hooks
    try:
        plan = hooks(hookspecs.devplug_precision, precision=precision)
    except PrecisionError as exc:
        if precision in ("auto", "32-true"):
            raise dut.fail(f"refused precision {precision!r} ({exc}); every device must run it") from exc
        if not str(exc).strip():
            raise dut.fail(f"refused precision {precision!r} with an empty PrecisionError message") from exc
        return f"refuses {precision}: {exc}"
    except Exception as exc:
        raise dut.fail(
            f"devplug_precision({precision!r}) raised {type(exc).__name__}: {exc}; raise devplug.PrecisionError "
            "for a setting the device cannot run"
        ) from exc
    if not isinstance(plan, PrecisionPlan):
        raise dut.fail(f"devplug_precision({precision!r}) returned {plan!r}, not a devplug.PrecisionPlan")
    if not plan.name or plan.name == "auto":
        raise dut.fail(f"devplug_precision({precision!r}) did not resolve the setting (plan name {plan.name!r})")
    if precision != "auto" and plan.name != precision:
        raise dut.fail(f"asked for {precision!r}, the plan says {plan.name!r}; raise PrecisionError instead")
    if plan.scaler is not None:
        if plan.name != "16-mixed":
            raise dut.fail(f"the {plan.name} plan has a grad scaler; a scaler belongs only to 16-mixed (fp16)")
        needed = ("scale", "step", "update", "state_dict", "load_state_dict")
        missing = [m for m in needed if not hasattr(plan.scaler, m)]
        if missing:
            raise dut.fail(f"the grad scaler lacks {', '.join(missing)} (use torch.amp.GradScaler or alike)")
    module = torch.nn.Linear(4, 2)
    if plan.convert_module is not None:
        converted = plan.convert_module(module)
        module = converted if converted is not None else module
        if not isinstance(module, torch.nn.Module):
            raise dut.fail(f"the {plan.name} plan's convert_module returned {type(module).__name__}, not a module")
    module = hooks(hookspecs.devplug_to_device, obj=module)
    x = hooks(hookspecs.devplug_to_device, obj=torch.ones(3, 4))
    try:
        with plan.autocast():
            out = module(x)
            loss = out.float().pow(2).mean()
    except Exception as exc:
        raise dut.fail(f"the {plan.name} plan's autocast context failed: {type(exc).__name__}: {exc}") from exc
    if not math.isfinite(float(loss.detach().cpu())):
        raise dut.fail(f"a forward pass under the {plan.name} plan's autocast gave {float(loss)}")
    if plan.optimizer_step_context is not None:
        try:
            with plan.optimizer_step_context():
                pass
        except Exception as exc:
            raise dut.fail(
                f"the {plan.name} plan's optimizer_step_context failed: {type(exc).__name__}: {exc}"
            ) from exc
    return f"{precision} -> {plan.name}" + (f": {plan.description}" if plan.description else "")


@conformance_check("devplug_region")
def check_region(dut: DeviceUnderTest) -> str:
    """``devplug_region`` returns an enterable context manager (or ``None``) for each region the Trainer opens."""
    for name in REGIONS:
        ctx = dut.hooks(hookspecs.devplug_region, name=name)
        if ctx is None:
            continue
        if not (hasattr(ctx, "__enter__") and hasattr(ctx, "__exit__")):
            raise dut.fail(f"devplug_region({name!r}) returned {ctx!r}, not a context manager")
        try:
            with ctx:
                pass
        except Exception as exc:
            raise dut.fail(f"the devplug_region({name!r}) context failed: {type(exc).__name__}: {exc}") from exc
    return "regions: " + ", ".join(REGIONS)


@conformance_check("devplug_profiler_activities")
def check_profiler_activities(dut: DeviceUnderTest) -> str:
    """``devplug_profiler_activities`` names ProfilerActivity values, CPU among them, that profile a step here."""
    activities = dut.hooks(hookspecs.devplug_profiler_activities)
    if activities is None:
        return "activities: deferred"
    kinds = torch.profiler.ProfilerActivity
    if not activities or not all(isinstance(a, kinds) for a in activities):
        raise dut.fail(f"devplug_profiler_activities returned {activities!r}, not a list of ProfilerActivity")
    if kinds.CPU not in activities:
        raise dut.fail("devplug_profiler_activities must include ProfilerActivity.CPU (data wait and regions)")
    supported = torch.profiler.supported_activities()
    missing = [a.name for a in activities if a not in supported]
    if missing:
        raise dut.fail(f"devplug_profiler_activities names {missing}, which this torch cannot record "
                       f"(supported: {', '.join(a.name for a in supported)})")
    x = dut.hooks(hookspecs.devplug_to_device, obj=torch.ones(8, 8))
    with torch.profiler.profile(activities=activities) as profiler, torch.profiler.record_function("probe"):
        (x @ x).sum()
        dut.hooks(hookspecs.devplug_synchronize)
    if not any(event.name == "probe" for event in profiler.events()):
        raise dut.fail("a profile with these activities did not record a record_function range")
    return "activities: " + ", ".join(a.name for a in activities)


@conformance_check("devplug_peak_flops")
def check_peak_flops(dut: DeviceUnderTest) -> str:
    """``devplug_peak_flops`` gives a positive, finite FLOP/s figure (``PeakFlops`` or float), or ``None``, per plan."""
    seen = []
    for precision in PRECISIONS:
        try:
            plan = dut.hooks(hookspecs.devplug_precision, precision=precision)
        except PrecisionError:
            continue  # the device refuses this setting: no plan, no peak
        if plan is None:
            continue
        peak = dut.hooks(hookspecs.devplug_peak_flops, precision=plan.name)
        value = peak.value if isinstance(peak, PeakFlops) else peak
        if value is not None and (not isinstance(value, float) or not math.isfinite(value) or value <= 0):
            raise dut.fail(f"devplug_peak_flops({plan.name!r}) returned {peak!r}, not a positive, finite float "
                           "(or a PeakFlops holding one)")
        source = f" ({peak.source})" if isinstance(peak, PeakFlops) else ""
        seen.append(f"{plan.name}: " + (f"{value / 1e12:.3g} TFLOP/s{source}" if value else "unknown"))
    return "peaks: " + "; ".join(dict.fromkeys(seen))


@conformance_check("devplug_mark_step", over="phases")
def check_mark_step(dut: DeviceUnderTest, phase: Phase) -> str:
    """``devplug_mark_step`` accepts ``phase`` (called after backward and after each optimizer step)."""
    hooks = dut.hooks
    model = hooks(hookspecs.devplug_to_device, obj=torch.nn.Linear(2, 1))
    model(hooks(hookspecs.devplug_to_device, obj=torch.ones(1, 2))).sum().backward()
    try:
        hooks(hookspecs.devplug_mark_step, phase=phase)
    except Exception as exc:
        raise dut.fail(f"devplug_mark_step(phase={phase}) raised {type(exc).__name__}: {exc}") from exc
    return f"mark_step({phase.value}) ok"


@conformance_check("devplug_clip_grad_norm")
def check_clip_grad_norm(dut: DeviceUnderTest) -> str:
    """``devplug_clip_grad_norm`` clips gradients to ``max_norm`` in place and returns the norm before clipping."""
    hooks = dut.hooks
    model = hooks(hookspecs.devplug_to_device, obj=torch.nn.Linear(4, 3))
    x = hooks(hookspecs.devplug_to_device, obj=torch.full((2, 4), 10.0))
    model(x).pow(2).sum().backward()
    params = [p for p in model.parameters() if p.grad is not None]
    expected = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad.float().cpu()) for p in params]))
    norm = hooks(hookspecs.devplug_clip_grad_norm, parameters=params, max_norm=1.0, norm_type=2.0)
    if not isinstance(norm, torch.Tensor):
        raise dut.fail(f"devplug_clip_grad_norm returned {norm!r}, not the total norm as a tensor")
    if not torch.allclose(norm.float().cpu().reshape(()), expected, rtol=1e-2):
        raise dut.fail(f"devplug_clip_grad_norm returned norm {float(norm):.4g}, the gradients' norm was "
                       f"{float(expected):.4g}")
    clipped = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad.float().cpu()) for p in params]))
    if not clipped <= 1.0 + 1e-2:
        raise dut.fail(f"after devplug_clip_grad_norm(max_norm=1.0) the gradients' norm is {float(clipped):.4g}")
    return f"norm {float(expected):.4g} clipped to {float(clipped):.3g}"


def _backend_names(backend: str) -> list[str]:
    """``"gloo"`` → ``["gloo"]``; ``"cpu:gloo,cuda:nccl"`` → ``["gloo", "nccl"]``."""
    return [part.split(":")[-1].strip().lower() for part in backend.split(",") if part.strip()]


def _parameters(fn: Callable[..., Any]) -> set[str]:
    return set(inspect.signature(fn).parameters) - {"self", "module"}


@conformance_check("devplug_collective_setup")
def check_collective_setup(dut: DeviceUnderTest) -> str:
    """``devplug_collective_setup`` names a backend torch.distributed knows, with valid DDP/init arguments.

    A backend counts as known when it is in ``torch.distributed.Backend.backend_list`` after the hook
    ran, which includes backends a plugin registers with ``Backend.register_backend`` (HCCL, for one).
    """
    import torch.distributed as dist

    if not dist.is_available():
        raise NotApplicable("this torch build has no torch.distributed")
    launch = LaunchInfo(rank=0, world_size=2, local_rank=0, local_world_size=2, launcher="torchrun")
    setup = dut.hooks(hookspecs.devplug_collective_setup, launch=launch)
    if not isinstance(setup, CollectiveSetup):
        raise dut.fail(f"devplug_collective_setup returned {setup!r}, not a devplug.CollectiveSetup")
    if not isinstance(setup.backend, str) or not setup.backend.strip():
        raise dut.fail(f"devplug_collective_setup named no backend ({setup.backend!r})")
    known = set(dist.Backend.backend_list) - {"undefined"}
    unknown = [b for b in _backend_names(setup.backend) if b not in known]
    if unknown:
        raise dut.fail(
            f"collective backend {setup.backend!r} is unknown to torch.distributed "
            f"(known: {', '.join(sorted(known))}); "
            "import the library that registers it (torch.distributed.Backend.register_backend) in the hook"
        )
    from torch.nn.parallel import DistributedDataParallel

    bad_ddp = sorted(set(setup.ddp_kwargs) - _parameters(DistributedDataParallel.__init__))
    if bad_ddp:
        raise dut.fail(f"ddp_kwargs {bad_ddp} are not DistributedDataParallel arguments in this torch")
    bad_init = sorted(set(setup.init_kwargs) - _parameters(dist.init_process_group))
    if bad_init:
        raise dut.fail(f"init_kwargs {bad_init} are not init_process_group arguments in this torch")
    return f"backend {setup.backend}, DDP defaults {dict(setup.ddp_kwargs)}"


@conformance_check("devplug_dataloader")
def check_dataloader(dut: DeviceUnderTest) -> str:
    """``devplug_dataloader`` returns a :class:`LoaderChoice` whose loader yields every sample in batches."""
    hooks, device = dut.hooks, dut.device
    x, y = _toy_regression(10)
    dataset = torch.utils.data.TensorDataset(x, y)
    options = LoaderOptions(batch_size=4, shuffle=True, num_workers=0, persistent_workers=False, seed=3)
    choice = hooks(hookspecs.devplug_dataloader, source=dataset, options=options)
    if not isinstance(choice, LoaderChoice):
        raise dut.fail(f"devplug_dataloader returned {choice!r}, not a devplug.LoaderChoice")
    if not choice.implementation:
        raise dut.fail("devplug_dataloader did not name its implementation (LoaderChoice.implementation)")
    seen = 0
    for batch in choice.loader:
        if not choice.on_device:
            batch = hooks(hookspecs.devplug_to_device, obj=batch)
        inputs, _targets = batch
        if not _on_device(inputs, device):
            where = "on_device=True but batches arrive on " if choice.on_device else "batches moved to "
            raise dut.fail(f"{choice.implementation}: {where}{inputs.device}, not {device.torch_device}")
        if inputs.shape[1:] != x.shape[1:]:
            raise dut.fail(f"{choice.implementation} changed the sample shape to {tuple(inputs.shape[1:])}")
        seen += inputs.shape[0]
    if seen != len(dataset):
        raise dut.fail(
            f"{choice.implementation} yielded {seen} samples of a dataset of {len(dataset)} (drop_last=False)"
        )
    return choice.implementation


@conformance_check("devplug_synchronize", "devplug_memory_stats")
def check_synchronize_and_memory(dut: DeviceUnderTest) -> str:
    """``devplug_synchronize`` returns; ``devplug_memory_stats`` gives :class:`MemoryStats` or ``None``."""
    hooks = dut.hooks
    hooks(hookspecs.devplug_to_device, obj=torch.ones(8)).sum()
    hooks(hookspecs.devplug_synchronize)
    stats = hooks(hookspecs.devplug_memory_stats)
    if stats is None:
        return "memory stats: not reported"
    if not isinstance(stats, MemoryStats):
        raise dut.fail(f"devplug_memory_stats returned {stats!r}, not a devplug.MemoryStats")
    for field in attrs.fields(MemoryStats):
        value = getattr(stats, field.name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise dut.fail(f"MemoryStats.{field.name} must be a number of bytes or None, got {value!r}")
    return f"memory stats: {stats}"


@conformance_check("devplug_log")
def check_log(dut: DeviceUnderTest) -> str:
    """``devplug_log`` accepts a point with values, one with an image and the final one, and returns nothing."""
    points = (LogPoint(step=1, values={"loss": 0.5, "lr/model": 1e-3}),
              LogPoint(step=1, images={"grid": torch.rand(3, 4, 4)}), LogPoint(step=1, final=True))
    for point in points:
        answers = dut.hooks(hookspecs.devplug_log, point=point)  # an exception inside is named by the guard
        if any(answer is not None for answer in answers or ()):
            raise dut.fail(f"devplug_log returned {answers!r}; it returns nothing")
    return "log points: values, images, final"


@conformance_check("devplug_doctor", needs_device=False)
def check_doctor(dut: DeviceUnderTest) -> str:
    """``devplug_doctor`` of the device's plugin (and its distribution's others) gives a DoctorReport or ``None``."""
    pm = dut.plugin_manager
    family = {name for name, _ in _plugin_family(dut)}
    answered = []
    for impl in pm.hook.devplug_doctor.get_hookimpls():
        if impl.plugin_name not in family:
            continue
        try:
            report = impl.function()
        except PluginError as exc:
            raise dut.fail(str(exc)) from exc
        if report is not None and not isinstance(report, DoctorReport):  # the guard reports it; belt and braces
            raise dut.fail(f"devplug_doctor returned {report!r}, not a devplug.DoctorReport")
        if report is not None:
            answered.append(f"{impl.plugin_name}: {len(report.packages)} package(s), {len(report.env)} variable(s), "
                            f"{len(report.warnings)} warning(s)")
    return "; ".join(answered) or "nothing contributed"


@conformance_check("devplug_compile", options={"run": "run_compiled"})
def check_compile(dut: DeviceUnderTest, *, run: bool = False) -> str:
    """``devplug_compile`` returns a callable module (or ``None``); with ``run=True`` the result is called."""
    hooks = dut.hooks
    module = hooks(hookspecs.devplug_to_device, obj=torch.nn.Linear(4, 2))
    compiled = hooks(hookspecs.devplug_compile, module=module, options={})
    if compiled is None:
        return "compile: deferred (module used as is)"
    if not callable(compiled):
        raise dut.fail(f"devplug_compile returned {compiled!r}, which cannot be called")
    if run:
        x = hooks(hookspecs.devplug_to_device, obj=torch.ones(3, 4))
        with torch.no_grad():
            expected = module(x)
            got = compiled(x)
        if not torch.allclose(got.float().cpu(), expected.float().cpu(), atol=1e-4, rtol=1e-3):
            raise dut.fail("the compiled module computes something else than the module")
    return f"compile: {type(compiled).__name__}"


def _train(dut: DeviceUnderTest, precision: str, steps_epochs: int = 4) -> tuple[Any, torch.nn.Module, list[float]]:
    dut.require_available()
    trainer = dut.trainer(precision=precision, seed=0, log_every=1000)
    model = trainer.setup(torch.nn.Linear(4, 1), name="toy")
    optimizer = trainer.optimizer("adam", model.parameters(), lr=0.05)
    x, y = _toy_regression(64)
    loader = trainer.dataloader(torch.utils.data.TensorDataset(x, y), batch_size=16, shuffle=True, num_workers=0,
                                persistent_workers=False)
    xd, yd = trainer.to_device(x), trainer.to_device(y)

    def full_loss() -> float:
        with torch.no_grad():
            return float(torch.nn.functional.mse_loss(model(xd).float(), yd).cpu())

    losses = [full_loss()]
    for _epoch in trainer.epochs(steps_epochs):
        for inputs, targets in loader:
            if not _on_device(inputs, trainer.device):
                raise dut.fail(f"the Trainer's loader gave a batch on {inputs.device}, not {trainer.torch_device}")
            with trainer.autocast():
                loss = torch.nn.functional.mse_loss(model(inputs).float(), targets)
            trainer.backward(loss)
            trainer.step(optimizer)
            trainer.log(loss=loss)
        losses.append(full_loss())
    return trainer, model, losses


@conformance_check(options={"precision": "training_precision"})
def check_training(dut: DeviceUnderTest, precision: str = "auto") -> str:
    """A few Trainer steps (setup, optimizer, loader, autocast, backward, step, log) lower a toy loss."""
    trainer, _model, losses = _train(dut, precision)
    if not all(math.isfinite(v) for v in losses) or not losses[-1] < losses[0]:
        raise dut.fail(f"16 Trainer steps ({trainer.precision.name}) did not lower a toy loss: {losses}")
    summary = trainer.summary()
    trainer.close()
    return (f"loss {losses[0]:.3f} -> {losses[-1]:.3f} in {summary['steps']} steps "
            f"({summary['precision']}, {', '.join(summary['optimizers'].values())})")


@conformance_check(options={"precision": "training_precision"})
def check_checkpoint_on_cpu(dut: DeviceUnderTest, precision: str = "auto") -> str:
    """A checkpoint saved by a Trainer on the device holds only CPU tensors and loads into a CPU model."""
    trainer, model, _losses = _train(dut, precision, steps_epochs=1)
    with tempfile.TemporaryDirectory(prefix="devplug-conformance-") as tmp:
        path = Path(tmp) / "checkpoint.pt"
        trainer.save(path)
        trainer.close()
        try:
            state = torch.load(path, weights_only=True)  # no map_location: device tensors would fail here
        except Exception as exc:
            raise dut.fail(f"its checkpoint does not load without the device: {type(exc).__name__}: {exc}") from exc
    off_cpu = sorted({str(t.device) for t in _tensors(state) if t.device.type != "cpu"})
    if off_cpu:
        raise dut.fail(f"its checkpoint holds tensors on {', '.join(off_cpu)}; save CPU copies")
    cpu_model = torch.nn.Linear(4, 1)
    try:
        cpu_model.load_state_dict(state["modules"]["toy"])
    except (KeyError, RuntimeError) as exc:
        raise dut.fail(f"its checkpoint does not load into a CPU model: {exc}") from exc
    trained = {k: v.detach().float().cpu() for k, v in model.state_dict().items()}
    for key, value in cpu_model.state_dict().items():
        if not torch.allclose(value.float(), trained[key]):
            raise dut.fail(f"the CPU copy of {key} differs from the trained value on the device")
    return f"checkpoint of {len(state['modules']['toy'])} tensors loads on the CPU"


@attrs.frozen
class CheckResult:
    """One check's outcome: ``"passed"``, ``"failed"`` or ``"not applicable"``, with what it saw."""

    name: str
    outcome: str
    detail: str

    def __str__(self) -> str:
        return f"{self.outcome.upper():<15} {self.name}: {self.detail}"


def all_checks(
    *,
    optimizer_names: Sequence[str] = STANDARD_OPTIMIZERS,
    precisions: Sequence[str] = PRECISIONS,
    training_precision: str = "auto",
    run_compiled: bool = False,
) -> list[tuple[str, Callable[[DeviceUnderTest], str]]]:
    """Every check as ``(name, function of a DeviceUnderTest)``, in the order :func:`run_checks` runs them.

    The list follows the hook contract: each hook's checks in the order of :mod:`devplug.core.contract.hookspecs`,
    parametrised checks expanded (``optimizer[adam]``), end-to-end checks last.
    """
    selection: dict[str, Any] = {"optimizer_names": optimizer_names, "precisions": precisions, "phases": list(Phase),
                                 "training_precision": training_precision, "run_compiled": run_compiled}
    result: list[tuple[str, Callable[[DeviceUnderTest], str]]] = []
    for spec in sorted(CHECKS, key=lambda c: c.position):
        kwargs = {arg: selection[key] for arg, key in spec.options.items()}
        cases = [None] if spec.over is None else list(selection[spec.over])
        for case in cases:
            label = spec.name if case is None else f"{spec.name}[{getattr(case, 'value', case)}]"
            args = () if case is None else (case,)
            result.append((label, _bind(spec.function, args, kwargs)))
    return result


def _bind(function: Callable[..., str], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Callable[[Any], str]:
    return lambda dut: function(dut, *args, **kwargs)


def run_checks(
    name: str,
    plugin_manager: DevplugPluginManager | None = None,
    *,
    options: Mapping[str, Any] | None = None,
    **selection: Any,
) -> list[CheckResult]:
    """Run every check against device ``name`` and return the results (nothing raises but a missing device).

    ``selection`` is passed to :func:`all_checks` (``optimizer_names``, ``precisions``, ...).
    """
    dut = open_device(name, plugin_manager, options=options)
    results = []
    for check_name, check in all_checks(**selection):
        try:
            results.append(CheckResult(check_name, "passed", check(dut)))
        except NotApplicable as exc:
            results.append(CheckResult(check_name, "not applicable", str(exc)))
        except (AssertionError, DevplugError) as exc:
            results.append(CheckResult(check_name, "failed", str(exc)))
        except Exception as exc:
            results.append(CheckResult(check_name, "failed", f"{dut.label}: {type(exc).__name__}: {exc}"))
    return results



# Checks kept in modules of their own register on import (after those above, so the kit's order holds).
from devplug.testing.statecheck import check_optimizer_state  # noqa: E402,F401
