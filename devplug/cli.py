"""The ``devplug`` command: list device plugins and what they can do here; check a plugin's contract; doctor;
consolidate a sharded checkpoint into one file.

Every command but ``consolidate`` takes ``--json`` for scripts (the shapes are in docs/getting-started.md). Exit codes:
0 success, 1 a conformance check failed, 2 an error (unknown device, bad arguments), 3 ``check``'s
device is not available on this machine (0 with ``--allow-unavailable``), 130 interrupted (Ctrl-C).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn, TextIO

import attrs

from devplug._version import __version__
from devplug.core.contract.records import CONTRACT_VERSION
from devplug.core.errors import CheckpointError, DevplugError
from devplug.core.observe.doctor import Diagnosis, diagnose
from devplug.core.registry.bounded import time_limit
from devplug.core.registry.devices import DeviceRegistry
from devplug.core.registry.manager import (
    BUILTIN_DISTRIBUTION,
    ENV_BLOCK,
    ENV_DISABLE_AUTOLOAD,
    FALLBACK_NAME,
    DevplugPluginManager,
    get_plugin_manager,
)
from devplug.testing import CheckResult, ConformanceError, iter_checks, open_device

#: Exit codes of the ``devplug`` command.
EXIT_OK = 0
#: ``devplug check``: at least one check failed.
EXIT_FAILED = 1
#: An error: unknown device, bad arguments (argparse's own code for usage errors).
EXIT_ERROR = 2
#: ``devplug check``: the device is not available on this machine, so the checks that need it did not run.
EXIT_UNAVAILABLE = 3
#: Ctrl-C: the command stopped before it finished (128 + SIGINT, as a shell reports it).
EXIT_INTERRUPTED = 128 + signal.SIGINT  # the console entry point (devplug._console) says the same

#: How ``devplug devices --verbose`` marks a hook implementation's pluggy options.
_HOOK_OPTIONS = ("wrapper", "hookwrapper", "tryfirst", "trylast")


@attrs.frozen
class PluginInfo:
    """What ``devplug devices --verbose`` says about one loaded plugin."""

    name: str
    distribution: str
    version: str
    contract: str
    devices: tuple[str, ...]
    hooks: tuple[str, ...]
    #: Seconds its module took to import when the manager loaded it (``None``: registered without an import).
    import_seconds: float | None = None

    @property
    def import_time(self) -> str:
        """``"12 ms"``, ``"5.0 s"``, or ``"-"`` when the plugin was not imported by the manager."""
        took = self.import_seconds
        if took is None:
            return "-"
        return f"{took * 1000:.0f} ms" if took < 1 else f"{took:.1f} s"

    @property
    def kind(self) -> str:
        """``"device plugin (cpu)"``, ``"device-neutral"`` or ``"core fallback"``."""
        if self.devices:
            return f"device plugin ({', '.join(self.devices)})"
        return "core fallback" if self.name == FALLBACK_NAME else "device-neutral"


def _split_distribution(distribution: str, plugin: Any) -> tuple[str, str]:
    """``"name version"`` (as the manager records entry points) → (name, version)."""
    if distribution == BUILTIN_DISTRIBUTION:
        return "devplug", f"{__version__} (built-in)"
    name, _, version = distribution.rpartition(" ")
    if name and version[:1].isdigit():
        return name, version
    own = getattr(plugin, "__version__", None)
    return distribution, str(own) if own else "-"


def _contract_of(plugin: Any, distribution: str) -> str:
    """The contract version a plugin declares (devplug's own undeclared modules speak the current one)."""
    declared = getattr(plugin, "DEVPLUG_CONTRACT", None)
    if declared is None:
        return CONTRACT_VERSION if distribution == BUILTIN_DISTRIBUTION else "undeclared"
    return str(declared)


def _hooks_of(pm: DevplugPluginManager, plugin: Any) -> tuple[str, ...]:
    """Hook names ``plugin`` implements, each with its pluggy options, e.g. ``devplug_mark_step [wrapper]``."""
    hooks = []
    for caller in sorted(pm.get_hookcallers(plugin) or [], key=lambda c: c.name):
        options = [
            opt
            for impl in caller.get_hookimpls()
            if impl.plugin is plugin
            for opt in _HOOK_OPTIONS
            if getattr(impl, opt, False)
        ]
        hooks.append(caller.name + (f" [{', '.join(options)}]" if options else ""))
    return tuple(hooks)


def plugin_infos(pm: DevplugPluginManager, registry: DeviceRegistry | None = None) -> list[PluginInfo]:
    """Every registered plugin in load order, with its distribution, version, contract, devices and hooks."""
    registry = registry or DeviceRegistry(pm)
    devices_of: dict[str, list[str]] = {}
    for name in registry.names():
        devices_of.setdefault(registry.devices[name].plugin_name, []).append(name)
    infos = []
    for plugin_name, plugin in pm.list_name_plugin():
        if plugin is None:  # blocked
            continue
        distribution, version = _split_distribution(pm.distribution_of(plugin_name), plugin)
        infos.append(
            PluginInfo(
                name=plugin_name,
                distribution=distribution,
                version=version,
                contract=_contract_of(plugin, pm.distribution_of(plugin_name)),
                devices=tuple(devices_of.get(plugin_name, ())),
                hooks=_hooks_of(pm, plugin),
                import_seconds=pm.import_seconds.get(plugin_name),
            )
        )
    return infos


def _table(rows: Sequence[tuple[str, ...]], indent: str = "") -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [indent + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]


def devices_report(pm: DevplugPluginManager | None = None, *, verbose: bool = False) -> str:
    """The text ``devplug devices`` prints: every device, where it came from, available or why not.

    With ``verbose``, also each device's description and, per plugin, its distribution and version,
    the hook contract it declares, how long its module took to import, and the hooks it implements
    (with pluggy options such as ``wrapper`` or ``tryfirst``). Every probe runs at once under the time
    limit (``DEVPLUG_PROBE_TIMEOUT``); a probe that does not answer in time is named as such.
    """
    pm = pm or get_plugin_manager()
    registry = DeviceRegistry(pm)
    registry.probe_all()  # at once, so a probe that hangs costs one time limit and the others still answer
    rows = [("DEVICE", "PRIORITY", "STATUS", "COUNT", "PLUGIN", "FROM")]
    for name in registry.names():
        entry = registry.devices[name]
        availability = entry.availability()
        status = "available" if availability.available else "unavailable"
        rows.append((name, str(entry.spec.priority), status, str(entry.count()), entry.plugin_name,
                     entry.distribution))
    lines = _table(rows)
    notes = []
    for name in registry.names():  # one entry per device: its description (verbose), then why it is unavailable
        entry = registry.devices[name]
        availability = entry.availability()
        why = ""
        if not availability.available:
            why = f"{availability.reason}." + (f" Fix: {availability.fix}" if availability.fix else "")
        if verbose:
            notes.append(f"  {name}: {entry.spec.description}")
            if why:
                notes.append(f"      unavailable: {why}")
        elif why:
            notes.append(f"  {name}: {why}")
    if notes:
        lines += ["", "Details:", *notes]
    available = registry.available_names()
    lines += ["", f"'auto' selects: {available[0] if available else 'nothing (no device available)'}"]
    if verbose:
        lines += ["", "Plugins (load order; operational hooks reach the chosen device's plugin, "
                      "the device-neutral plugins and the core fallback):"]
        infos = plugin_infos(pm, registry)
        table = _table([("PLUGIN", "KIND", "DISTRIBUTION", "VERSION", "CONTRACT", "IMPORT")]
                       + [(i.name, i.kind, i.distribution, i.version, i.contract, i.import_time) for i in infos],
                       indent="  ")
        lines.append(table[0])
        for info, row in zip(infos, table[1:], strict=True):
            lines.append(row)
            lines.append(f"      hooks: {', '.join(info.hooks) or 'none'}")
        if pm.blocked_names:
            lines += ["", f"Blocked plugins ({ENV_BLOCK} or blocked=): {', '.join(sorted(pm.blocked_names))}"]
        if not pm.autoload:
            lines += ["", f"Entry-point plugins were not loaded: {ENV_DISABLE_AUTOLOAD} is set."]
    if registry.conflicts:
        lines += ["", "Device name conflicts (the other plugin's device was skipped):"]
        lines += [f"  {conflict}" for conflict in registry.conflicts]
    if pm.failures:
        lines += ["", "Plugins that failed to load (skipped):"]
        lines += [f"  {failure}" for failure in pm.failures]
    if pm.warnings:
        lines += ["", "Warnings:", *(f"  {warning}" for warning in pm.warnings)]
    return "\n".join(lines)


def _plugin_data(info: PluginInfo) -> dict[str, Any]:
    return {"name": info.name, "kind": info.kind, "distribution": info.distribution, "version": info.version,
            "contract": info.contract, "devices": list(info.devices), "hooks": list(info.hooks),
            "import_seconds": info.import_seconds}


def devices_data(pm: DevplugPluginManager | None = None) -> dict[str, Any]:
    """What ``devplug devices --json`` prints: the devices, the plugins and the loading problems, as data.

    The keys are stable (docs/getting-started.md lists them); every key is present whether or not its
    list is empty, and the plugins are always included (``--verbose`` changes only the text).
    """
    pm = pm or get_plugin_manager()
    registry = DeviceRegistry(pm)
    registry.probe_all()
    devices = []
    for name in registry.names():
        entry = registry.devices[name]
        availability = entry.availability()
        devices.append({"name": name, "priority": entry.spec.priority, "available": availability.available,
                        "count": entry.count(), "plugin": entry.plugin_name, "distribution": entry.distribution,
                        "description": entry.spec.description, "reason": availability.reason,
                        "fix": availability.fix})
    available = registry.available_names()
    return {
        "devplug": __version__,
        "contract": CONTRACT_VERSION,
        "auto": available[0] if available else None,
        "devices": devices,
        "plugins": [_plugin_data(info) for info in plugin_infos(pm, registry)],
        "blocked": sorted(pm.blocked_names),
        "autoload": pm.autoload,
        "conflicts": [str(c) for c in registry.conflicts],
        "failures": [str(f) for f in pm.failures],
        "warnings": list(pm.warnings),
    }


def _diagnosed(pm: DevplugPluginManager | None) -> tuple[DevplugPluginManager, DeviceRegistry, Diagnosis]:
    pm = pm or get_plugin_manager()
    registry = DeviceRegistry(pm)
    deadline = time.monotonic() + time_limit()  # the probes and the doctor hooks share one time limit
    for entry in registry.devices.values():
        entry.start_probe()
    diagnosis = diagnose(pm, deadline=deadline)
    registry.probe_all(deadline)
    return pm, registry, diagnosis


def doctor_data(pm: DevplugPluginManager | None = None) -> dict[str, Any]:
    """What ``devplug doctor --json`` prints: the report of `doctor_report` as data (stable keys)."""
    pm, registry, diagnosis = _diagnosed(pm)
    environment = diagnosis.environment()
    return {
        "devplug": __version__,
        "contract": CONTRACT_VERSION,
        "versions": {"devplug": __version__, **dict(sorted(diagnosis.versions.items(), key=lambda kv: kv[0].lower()))},
        "plugins": [_plugin_data(info) for info in plugin_infos(pm, registry)],
        "devices": [{"name": name, "available": a.available, "reason": a.reason, "fix": a.fix}
                    for name in registry.names() for a in [registry.devices[name].availability()]],
        "environment": environment,
        "unset_patterns": [p for p in diagnosis.env_patterns
                           if "*" in p and not any(k.startswith(p.rstrip("*")) for k in environment)],
        "incompatible": [{"plugin": f.plugin, "text": f.text} for f in diagnosis.incompatible],
        "warnings": [{"plugin": f.plugin, "text": f.text} for f in diagnosis.warnings],
        "plugin_loading": [str(f) for f in pm.failures] + [str(c) for c in registry.conflicts] + list(pm.warnings),
    }


def doctor_report(pm: DevplugPluginManager | None = None) -> str:
    """The text ``devplug doctor`` prints: what a bug report needs and what commonly goes wrong here.

    Versions (devplug, Python, torch, each plugin and its stack), the devices and why one is unavailable,
    the environment variables the plugins declare (set ones with their values), incompatible pairs and
    warnings the plugins found, and plugins that failed to load. Probes and ``devplug_doctor`` hooks
    run under the time limit (``DEVPLUG_PROBE_TIMEOUT``); one that does not answer in time is named.
    """
    pm, registry, diagnosis = _diagnosed(pm)
    lines = ["devplug doctor: paste this whole report into a bug report", "", "Versions:"]
    versions = sorted(diagnosis.versions.items(), key=lambda kv: kv[0].lower())
    lines += _table([("devplug", __version__), *versions], indent="  ")
    lines += ["", "Plugins (load order):"]
    lines += _table([(i.name, i.kind, i.distribution, i.version, f"contract {i.contract}")
                     for i in plugin_infos(pm, registry)], indent="  ")
    lines += ["", "Devices:"]
    for name in registry.names():
        availability = registry.devices[name].availability()
        lines.append(f"  {name}: " + ("available" if availability.available else f"unavailable: {availability.reason}"))
    lines += ["", "Environment (variables that change device behaviour; * lists every one set):"]
    environment = diagnosis.environment()
    lines += [f"  {key}={value}" if value is not None else f"  {key} (unset)" for key, value in environment.items()]
    unset_prefixes = [p for p in diagnosis.env_patterns
                      if "*" in p and not any(k.startswith(p.rstrip("*")) for k in environment)]
    if unset_prefixes:
        lines.append(f"  none set: {', '.join(unset_prefixes)}")
    for title, findings in (("Incompatible pairs", diagnosis.incompatible), ("Warnings", diagnosis.warnings)):
        lines += ["", f"{title}:" if findings else f"{title}: none found"]
        lines += [f"  [{f.plugin}] {f.text}" for f in findings]
    problems = [str(f) for f in pm.failures] + [str(c) for c in registry.conflicts] + list(pm.warnings)
    if problems:
        lines += ["", "Plugin loading:", *(f"  {p}" for p in problems)]
    return "\n".join(lines)


@attrs.frozen
class CheckRun:
    """A ``devplug check``: the device, its plugin, whether it is available here, the results, the exit code."""

    device: str
    plugin: str
    distribution: str
    contract: str
    available: bool
    reason: str
    results: tuple[CheckResult, ...]
    allow_unavailable: bool = False

    def count(self, outcome: str) -> int:
        """How many results have ``outcome``."""
        return sum(1 for r in self.results if r.outcome == outcome)

    @property
    def exit_code(self) -> int:
        """1 when a check failed, else 3 when the device is unavailable here (unless allowed), else 0."""
        if self.count("failed"):
            return EXIT_FAILED
        if not self.available and not self.allow_unavailable:
            return EXIT_UNAVAILABLE
        return EXIT_OK

    def data(self) -> dict[str, Any]:
        """What ``devplug check --json`` prints (stable keys, docs/getting-started.md)."""
        return {
            "device": self.device, "plugin": self.plugin, "distribution": self.distribution,
            "contract": self.contract, "available": self.available, "reason": self.reason,
            "results": [{"name": r.name, "outcome": r.outcome, "detail": r.detail, "since": r.since}
                        for r in self.results],
            "counts": {"passed": self.count("passed"), "failed": self.count("failed"),
                       "not_applicable": self.count("not applicable"), "advisory": self.count("advisory")},
            "exit_code": self.exit_code,
        }

    def report(self) -> str:
        """The text ``devplug check`` prints: one line per check, the counts, and why the device did not run."""
        return "\n".join([*(str(r) for r in self.results), self.summary()])

    def summary(self) -> str:
        """The lines after the results: the counts, and why the device did not run."""
        lines: list[str] = []
        advisory = self.count("advisory")
        advisory_text = (f"{advisory} advisory (checks of a contract newer than the plugin's {self.contract}), "
                         if advisory else "")
        lines += ["", f"{self.count('passed')} passed, {advisory_text}{self.count('failed')} failed, "
                      f"{self.count('not applicable')} not applicable on this machine"]
        if not self.available:
            outcome = ("allowed by --allow-unavailable" if self.allow_unavailable
                       else f"exit code {EXIT_UNAVAILABLE}; --allow-unavailable accepts it")
            lines.append(f"device {self.device!r} is not available here ({outcome}): {self.reason}")
        return "\n".join(lines)


def run_check(device: str, *, run_compiled: bool = False, allow_unavailable: bool = False,
              pm: DevplugPluginManager | None = None,
              on_result: Callable[[CheckResult], None] | None = None) -> CheckRun:
    """Run the conformance kit against ``device`` (raises `ConformanceError` when nobody registers it).

    ``on_result`` is called with each result as its check finishes (``devplug check`` prints it then).
    """
    pm = pm or get_plugin_manager()
    dut = open_device(device, pm)
    availability = dut.availability
    results = []
    for result in iter_checks(device, pm, run_compiled=run_compiled):
        results.append(result)
        if on_result is not None:
            on_result(result)
    return CheckRun(device=device, plugin=dut.entry.plugin_name, distribution=dut.entry.distribution,
                    contract=dut.contract, available=availability.available, reason=availability.reason,
                    results=tuple(results), allow_unavailable=allow_unavailable)


def check_report(device: str, *, run_compiled: bool = False) -> tuple[str, bool]:
    """Run the conformance kit against ``device``; return the report and whether no check failed."""
    run = run_check(device, run_compiled=run_compiled)
    return run.report(), not run.count("failed")


#: ``devplug --help``: plain text (the module docstring is written for the API docs).
DESCRIPTION = f"""\
List device plugins and what they can do here, check a plugin against the hook
contract, gather what a bug report needs, and turn a sharded checkpoint into
one file.

Every command but consolidate takes --json for scripts. Exit codes: {EXIT_OK} success,
{EXIT_FAILED} a conformance check failed, {EXIT_ERROR} an error (unknown device, bad arguments),
{EXIT_UNAVAILABLE} the device of check is not available on this machine ({EXIT_OK} with
--allow-unavailable), {EXIT_INTERRUPTED} interrupted (Ctrl-C).
"""


def consolidate(source: str, target: str, module: str | None = None) -> str:
    """``devplug consolidate``: one module's full weights from the sharded checkpoint ``source`` into the file
    ``target`` (a plain ``state_dict`` that ``torch.load`` reads); the line to print."""
    from devplug.core.checkpoint.sharded import consolidate_checkpoint, is_sharded_checkpoint

    folder, file = Path(source).expanduser(), Path(target).expanduser()
    if not folder.exists():
        raise CheckpointError(f"checkpoint {str(folder)!r} does not exist")
    if not folder.is_dir() or not is_sharded_checkpoint(folder):
        what = "a file" if folder.is_file() else "a folder"
        raise CheckpointError(f"{str(folder)!r} is {what}, not a sharded checkpoint (a folder of shards that a run "
                              "with strategy='fsdp' wrote); a plain checkpoint file is already one file")
    if file.is_dir():
        raise CheckpointError(f"{str(file)!r} is a folder; name the file to write")
    try:
        written = consolidate_checkpoint(folder, file, module=module)
    except OSError as exc:  # the weights cannot be written there: a full disk, a parent that is a file, no permission
        from devplug.core.checkpoint.diskfull import disk_full_cause, disk_full_line

        full = disk_full_cause(exc)
        if full is not None:
            raise CheckpointError(disk_full_line(repr(str(file)), full)) from None
        if exc.filename is not None and Path(exc.filename).resolve().is_relative_to(folder.resolve()):
            raise CheckpointError(f"cannot read checkpoint {str(folder)!r}: {exc}") from None
        raise CheckpointError(f"cannot write {str(file)!r}: {exc}") from None
    return f"wrote {written}: the full weights as one plain state_dict (torch.load(path, weights_only=True))"


class _CommandParser(argparse.ArgumentParser):
    """argparse's parser (its sub-commands' too) keeping its last usage error, which ``--json`` prints as data."""

    last_error: str | None = None

    def error(self, message: str) -> NoReturn:
        _CommandParser.last_error = f"{self.prog}: {message}"
        super().error(message)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``devplug`` command."""
    parser = _CommandParser(prog="devplug", description=DESCRIPTION,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"devplug {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    devices = sub.add_parser("devices", help="list device plugins, availability and why not")
    devices.add_argument("-v", "--verbose", action="store_true",
                         help="also show each plugin's distribution, version, contract, import time and hooks")
    check = sub.add_parser(
        "check", help="run the plugin conformance checks against a device",
        description="Run the conformance checks against a device. Exit codes: 0 every check passed (or is "
                    f"advisory), {EXIT_FAILED} a check failed, {EXIT_ERROR} no plugin registers the device, "
                    f"{EXIT_UNAVAILABLE} the device is not available on this machine (0 with --allow-unavailable).")
    check.add_argument("device", help="a device name as `devplug devices` lists it")
    check.add_argument("--run-compiled", action="store_true",
                       help="also run the module devplug_compile returns (slow with inductor)")
    check.add_argument("--allow-unavailable", action="store_true",
                       help=f"exit 0, not {EXIT_UNAVAILABLE}, when the device is not available on this machine")
    doctor = sub.add_parser("doctor", help="versions, environment, incompatible pairs and warnings for a bug report")
    merge = sub.add_parser(
        "consolidate", help="write a sharded checkpoint's full weights as one plain file",
        description="Write one module's full weights from a sharded checkpoint folder (strategy='fsdp') into one "
                    "plain state_dict file that torch.load reads, in this one process.")
    merge.add_argument("source", metavar="SHARDED_DIR", help="the sharded checkpoint, a folder step_NNNNNNN.pt/")
    merge.add_argument("target", metavar="OUT.pt", help="the file to write, outside SHARDED_DIR (replaced atomically)")
    merge.add_argument("--module", default=None,
                       help="the module to write, by the name given to Trainer.setup (needed when there are several)")
    for command in (devices, check, doctor):
        command.add_argument("--json", action="store_true",
                             help="print one JSON object instead of text (keys: docs/getting-started.md)")
    return parser


#: Where ``--json`` prints its object: the command's stdout, while what plugins print goes to stderr.
_json_out: list[TextIO] = []


def _print_json(data: dict[str, Any]) -> None:
    print(json.dumps(data, indent=2, default=str), file=_json_out[-1] if _json_out else sys.stdout, flush=True)


@contextlib.contextmanager
def _plugin_output_to_stderr(json_wanted: bool) -> Iterator[None]:
    """With ``--json``: inside, ``print`` goes to stderr (a plugin or vendor stack printing while it is loaded,
    probed or checked), so stdout holds the one JSON object and nothing else."""
    if not json_wanted:
        yield
        return
    _json_out.append(sys.stdout)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        _json_out.pop()


def _check(args: argparse.Namespace) -> int:
    """``devplug check``: each result printed as its check finishes; ``--json``: one object, even when interrupted."""
    seen: list[CheckResult] = []

    def show(result: CheckResult) -> None:
        seen.append(result)
        if not args.json:
            print(result, flush=True)

    device = args.device.strip().lower()  # as the Trainer reads a device name: `check CPU` is `check cpu`
    try:
        run = run_check(device, run_compiled=args.run_compiled, allow_unavailable=args.allow_unavailable,
                        on_result=show)
    except KeyboardInterrupt:
        if args.json:
            _print_json({"device": device, "error": "interrupted before every check ran",
                         "results": [{"name": r.name, "outcome": r.outcome, "detail": r.detail, "since": r.since}
                                     for r in seen], "exit_code": EXIT_INTERRUPTED})
        print(f"devplug: interrupted after {len(seen)} checks", file=sys.stderr)
        return EXIT_INTERRUPTED
    if args.json:
        _print_json(run.data())
    else:
        print(run.summary())
    return run.exit_code


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``devplug`` console script."""
    logging.basicConfig(level=logging.WARNING, format="devplug: %(message)s")
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    _CommandParser.last_error = None
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # a usage error: with --json, the error as data on stdout too
        if exc.code == EXIT_ERROR and "--json" in argv and _CommandParser.last_error:
            _print_json({"error": _CommandParser.last_error, "exit_code": EXIT_ERROR})
        raise
    if args.command is None:
        parser.print_help()
        return 0
    with _plugin_output_to_stderr(getattr(args, "json", False)):
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    """Run the parsed command; its exit status."""
    try:
        if args.command == "devices":
            if args.json:
                _print_json(devices_data())
            else:
                print(devices_report(verbose=args.verbose))
        elif args.command == "doctor":
            if args.json:
                _print_json(doctor_data())
            else:
                print(doctor_report())
        elif args.command == "check":
            return _check(args)
        elif args.command == "consolidate":
            print(consolidate(args.source, args.target, args.module))
    except (DevplugError, ConformanceError) as exc:  # ConformanceError: the device is not registered at all
        if getattr(args, "json", False):
            _print_json({"error": str(exc), "exit_code": EXIT_ERROR})
        print(f"devplug: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
