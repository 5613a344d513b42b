"""The ``devplug`` command: list device plugins and what they can do here."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from devplug._version import __version__
from devplug.core.devices import DeviceRegistry
from devplug.core.errors import DevplugError
from devplug.core.manager import DevplugPluginManager, get_plugin_manager


def _hooks_of(pm: DevplugPluginManager, plugin_name: str) -> list[str]:
    plugin = pm.get_plugin(plugin_name)
    return sorted(caller.name for caller in pm.get_hookcallers(plugin) or [])


def devices_report(pm: DevplugPluginManager | None = None, *, verbose: bool = False) -> str:
    """The text ``devplug devices`` prints: every device, where it came from, available or why not."""
    pm = pm or get_plugin_manager()
    registry = DeviceRegistry(pm)
    rows = [("DEVICE", "PRIORITY", "STATUS", "COUNT", "PLUGIN", "FROM")]
    for name in registry.names():
        entry = registry.devices[name]
        availability = entry.availability()
        status = "available" if availability.available else "unavailable"
        rows.append((name, str(entry.spec.priority), status, str(entry.count()), entry.plugin_name,
                     entry.distribution))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    notes = []
    for name in registry.names():
        entry = registry.devices[name]
        availability = entry.availability()
        if not availability.available:
            fix = f" Fix: {availability.fix}" if availability.fix else ""
            notes.append(f"  {name}: {availability.reason}.{fix}")
        if verbose:
            notes.append(f"  {name}: {entry.spec.description}")
    if notes:
        lines += ["", "Details:", *notes]
    available = registry.available_names()
    lines += ["", f"'auto' selects: {available[0] if available else 'nothing (no device available)'}"]
    if verbose:
        lines += ["", "Plugins:"]
        for plugin_name, _plugin in sorted(pm.list_name_plugin(), key=lambda item: str(item[0])):
            hooks = ", ".join(_hooks_of(pm, plugin_name)) or "none"
            lines.append(f"  {plugin_name} ({pm.distribution_of(plugin_name)}): {hooks}")
    if pm.failures:
        lines += ["", "Plugins that failed to load (skipped):"]
        lines += [f"  {failure}" for failure in pm.failures]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``devplug`` command."""
    parser = argparse.ArgumentParser(prog="devplug", description=__doc__)
    parser.add_argument("--version", action="version", version=f"devplug {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    devices = sub.add_parser("devices", help="list device plugins, availability and why not")
    devices.add_argument("-v", "--verbose", action="store_true", help="also show each plugin's hooks and origin")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``devplug`` console script."""
    logging.basicConfig(level=logging.WARNING, format="devplug: %(message)s")
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    try:
        if args.command == "devices":
            print(devices_report(verbose=args.verbose))
    except DevplugError as exc:
        print(f"devplug: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
