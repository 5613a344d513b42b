"""devplug's device conformance checks, run on the HPU plugin against the stand-in Gaudi stack.

The same checks a third-party device plugin runs on itself (``devplug.testing.DeviceConformance``);
here the Intel packages are the recording stand-in and tensors live on the CPU.
"""

from __future__ import annotations

import pytest
from standins import hpu_fixtures

from devplug.core.registry.manager import DevplugPluginManager, create_plugin_manager
from devplug.testing import DeviceConformance

pytestmark = pytest.mark.filterwarnings("ignore:'pin_memory' argument is set as true:UserWarning")


class TestHpuConformanceLazy(DeviceConformance):
    """Lazy mode (the default before release 1.21): step marking on, compile skipped."""

    device_name = "hpu"
    require_available = True
    lazy = True

    @pytest.fixture(autouse=True)
    def _standin(self, monkeypatch: pytest.MonkeyPatch):
        yield from hpu_fixtures.standin(monkeypatch, lazy=self.lazy)

    def make_plugin_manager(self) -> DevplugPluginManager:
        """Built-in plugins only."""
        return create_plugin_manager(autoload=False)


class TestHpuConformanceEager(TestHpuConformanceLazy):
    """Eager mode (the default since release 1.21): no step marking, torch.compile with hpu_backend."""

    lazy = False
    run_compiled = True
