"""Checks of the plugin itself: it loads cleanly, its probe answers honestly, its device sets up, its doctor reports.

All but the device setup run without the device: they are what a plugin author sees first on a
machine without the hardware.
"""

from __future__ import annotations

from devplug.core.contract import hookspecs
from devplug.core.contract.records import CONTRACT_VERSION, Availability, DoctorReport
from devplug.core.contract.versions import contract_problem
from devplug.core.errors import PluginError
from devplug.core.registry.bounded import ENV_TIME_LIMIT, call_with_limit, seconds, time_limit
from devplug.core.registry.manager import BUILTIN_DISTRIBUTION, ENV_BLOCK
from devplug.testing.kit import DeviceUnderTest, KitHooks, conformance_check


def _plugin_family(dut: DeviceUnderTest) -> list[tuple[str, object]]:
    """The plugins that take part in the device's hooks or ship with its plugin: the device plugin, every other
    plugin of its (third-party) distribution, and every third party's device-neutral plugin (it takes part in
    the hooks of every device, so a neutral plugin's author checks it with any device's kit)."""
    pm = dut.plugin_manager
    dist = dut.entry.distribution
    device_plugins = dut.registry.device_plugin_names()
    family = [(dut.entry.plugin_name, dut.entry.plugin)]
    for name, plugin in pm.list_name_plugin():
        if name == dut.entry.plugin_name or plugin is None:
            continue
        mine = dist != BUILTIN_DISTRIBUTION and pm.distribution_of(name) == dist
        neutral = name not in device_plugins and pm.distribution_of(name) != BUILTIN_DISTRIBUTION
        if mine or neutral:
            family.append((name, plugin))
    return family


@conformance_check("devplug_register_devices", needs_device=False)
def check_plugin_loaded(dut: DeviceUnderTest) -> str:
    """The plugin (and each device-neutral one) loaded cleanly: no third-party load failures, a compatible
    ``DEVPLUG_CONTRACT``, and no ``devplug_*`` function without ``@devplug.hookimpl`` (pluggy would ignore it)."""
    pm = dut.plugin_manager
    dist = dut.entry.distribution
    if dist != BUILTIN_DISTRIBUTION:
        failed = [str(f) for f in pm.failures if f.distribution == dist]
        if failed:
            raise dut.fail("other plugins of the same distribution failed to load: " + "; ".join(failed))
    others = [str(f) for f in pm.failures if f.distribution not in (dist, BUILTIN_DISTRIBUTION)]
    if others:  # a device-neutral plugin among them would take part in this device's hooks: checked without it
        raise dut.fail(f"{'; '.join(others)}; the device was checked without it (a device-neutral plugin takes part "
                       f"in every device's hooks): fix it, or skip it with {ENV_BLOCK} if it is not yours")
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
    """The probe answers within the time limit with an `Availability` (never raises); a reason when unavailable;
    a count (within the limit too)."""
    spec = dut.entry.spec
    limit = time_limit()
    dut.availability  # noqa: B018 - the probe as devplug runs it: once, bounded
    if dut.entry.probe_timed_out:
        raise dut.fail(f"its availability probe did not answer within {seconds(limit)} ({ENV_TIME_LIMIT} sets the "
                       "limit); a probe must answer quickly, or return Availability.no(reason, fix)")
    try:
        answer = call_with_limit(spec.probe, f"probe of device {spec.name!r}", limit=limit)
    except PluginError as exc:
        raise dut.fail(str(exc)) from exc
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
        count = call_with_limit(spec.count, f"count of device {spec.name!r}", limit=limit)
    except PluginError as exc:
        raise dut.fail(str(exc)) from exc
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


@conformance_check("devplug_doctor", needs_device=False, since="1.2")
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
