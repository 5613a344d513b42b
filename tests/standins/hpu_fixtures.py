"""Running the HPU plugin against the stand-in of the Intel Gaudi packages (``hpu_standin/``).

The stand-in is importable only while a test uses `standin`: it puts ``hpu_standin`` first on
``sys.path``, and on the way out removes it and every module imported from it, so no other test can
see a ``habana_frameworks``. Tests wrap it in a fixture of their own::

    @pytest.fixture
    def hpu(monkeypatch):
        yield from hpu_fixtures.standin(monkeypatch)

The stand-in computes on the CPU, so the fixture also points the plugin's torch device type at
``"cpu"`` (``devplug.plugins.hpu.probe.TORCH_DEVICE_TYPE``, ``"hpu"`` when shipped): the Device record
and every hook behave as on a Gaudi, only the tensors live in host memory.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import attrs
import pytest

from devplug.core.contract.records import Device
from devplug.core.registry.devices import DeviceHooks, DeviceRegistry
from devplug.core.registry.manager import DevplugPluginManager, create_plugin_manager
from devplug.plugins.hpu import probe, runtime

STANDIN_PATH = Path(__file__).resolve().parent / "hpu_standin"
#: Top-level names the stand-in provides.
STANDIN_MODULES = ("habana_frameworks", "habana_dataloader", "hpu_standin_calls")
#: Variables ``initialize_distributed_hpu`` writes (as the real one does); restored after each test.
LAUNCH_VARIABLES = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "ID")


def _forget_standin_modules() -> None:
    for name in list(sys.modules):
        if name.split(".")[0] in STANDIN_MODULES:
            del sys.modules[name]


@attrs.define
class StandIn:
    """Handle on the active stand-in: its call log and the knobs a test may turn before first use."""

    monkeypatch: pytest.MonkeyPatch
    log: ModuleType

    @property
    def calls(self) -> list[tuple[str, dict[str, Any]]]:
        """Every recorded call, in order."""
        return self.log.CALLS

    def names(self) -> list[str]:
        """Names of the recorded calls, in order."""
        return self.log.names()

    def count(self, name: str) -> int:
        """How many times ``name`` was called."""
        return self.log.count(name)

    def details(self, name: str) -> list[dict[str, Any]]:
        """Arguments of every call named ``name``."""
        return self.log.details(name)

    def reset(self) -> None:
        """Forget the calls recorded so far."""
        self.log.reset()

    def lazy(self, on: bool) -> None:
        """Run the bridge in lazy (``PT_HPU_LAZY_MODE=1``) or eager (``0``) mode."""
        self.monkeypatch.setenv("PT_HPU_LAZY_MODE", "1" if on else "0")

    def devices(self, count: int) -> None:
        """How many Gaudi devices the stand-in reports."""
        self.monkeypatch.setenv("HPU_STANDIN_DEVICES", str(count))

    def remove(self, module: str) -> None:
        """Make ``module`` unimportable, as on a release (or installation) that does not ship it."""
        self.monkeypatch.setitem(sys.modules, module, None)

    def plugin_manager(self) -> DevplugPluginManager:
        """A plugin manager with the built-in plugins only (no third-party entry points)."""
        return create_plugin_manager(autoload=False)

    def hooks(self, **options: Any) -> DeviceHooks:
        """The operational hooks routed to the HPU plugin, for a resolved ``hpu`` device."""
        registry = DeviceRegistry(self.plugin_manager())
        return DeviceHooks(registry, registry.resolve("hpu", options=options))

    def device(self, **options: Any) -> Device:
        """A resolved ``hpu`` device record."""
        return DeviceRegistry(self.plugin_manager()).resolve("hpu", options=options)


def standin(monkeypatch: pytest.MonkeyPatch, *, lazy: bool = True, devices: int = 1) -> Iterator[StandIn]:
    """Activate the stand-in for one test (generator for a fixture); yields its `StandIn` handle."""
    _forget_standin_modules()
    runtime.reset()
    saved = {name: os.environ.get(name) for name in LAUNCH_VARIABLES}
    monkeypatch.syspath_prepend(str(STANDIN_PATH))
    monkeypatch.setattr(probe, "TORCH_DEVICE_TYPE", "cpu")
    monkeypatch.delenv("HPU_STANDIN_IMPORT_ERROR", raising=False)
    import hpu_standin_calls

    hpu_standin_calls.reset()
    handle = StandIn(monkeypatch, hpu_standin_calls)
    handle.lazy(lazy)
    handle.devices(devices)
    try:
        yield handle
    finally:
        monkeypatch.undo()
        _forget_standin_modules()
        runtime.reset()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
