"""The conformance kit holds a plugin to the contract it declares: a 1.0 plugin, unchanged, still passes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import devplug
from devplug.core.registry.manager import DevplugPluginManager, create_plugin_manager
from devplug.testing import DeviceConformance, open_device, run_checks
from devplug.testing.checks import registered_checks
from devplug.testing.kit import conformance_check


class OldVendor:
    """A third-party device plugin as its author wrote it for contract 1.0 (devplug 0.1), never touched since.

    Its ``devplug_to_device`` moves objects with plain ``.to(device)``: contract 1.0 had no
    ``Device.channels_last``, so it knows nothing of memory formats.
    """

    DEVPLUG_CONTRACT = "1.0"

    @devplug.hookimpl
    def devplug_register_devices(self) -> devplug.DeviceSpec:
        return devplug.DeviceSpec(name="oldvendor", description="a contract-1.0 device on the CPU", priority=-5,
                                  probe=devplug.Availability.yes, torch_type="cpu")

    @devplug.hookimpl
    def devplug_to_device(self, device: devplug.Device, obj: Any) -> Any:
        if isinstance(obj, (torch.Tensor, torch.nn.Module)):
            return obj.to(device.torch_device)
        if isinstance(obj, dict):
            return {key: self.devplug_to_device(device, value) for key, value in obj.items()}
        if isinstance(obj, tuple) and hasattr(obj, "_fields"):
            return type(obj)(*(self.devplug_to_device(device, value) for value in obj))
        if isinstance(obj, (list, tuple)):
            return type(obj)(self.devplug_to_device(device, value) for value in obj)
        return obj


class NewVendor(OldVendor):
    """The same code declaring the current contract: it must honour channels_last."""

    DEVPLUG_CONTRACT = devplug.CONTRACT_VERSION


def _manager(plugin: Any) -> DevplugPluginManager:
    return create_plugin_manager(autoload=False, extra_plugins=[("oldvendor", plugin)])


def _run(plugin: Any) -> dict[str, Any]:
    results = run_checks("oldvendor", _manager(plugin), optimizer_names=("sgd",), precisions=("32-true",))
    return {r.name: r for r in results}


def test_an_unchanged_contract_1_0_plugin_passes_the_kit():
    results = _run(OldVendor())
    assert [str(r) for r in results.values() if r.outcome == "failed"] == []
    advisory = results["to_device_channels_last"]
    assert advisory.outcome == "advisory"
    assert advisory.since == "1.1"
    assert "conv weights in the default layout" in advisory.detail
    assert "introduced in contract 1.1; the plugin declares 1.0, so it need not pass yet" in advisory.detail


def test_the_same_plugin_declaring_the_current_contract_fails_the_newer_check():
    results = _run(NewVendor())
    assert results["to_device_channels_last"].outcome == "failed"
    assert [name for name, r in results.items() if r.outcome == "failed"] == ["to_device_channels_last"]


@pytest.mark.parametrize(("declared", "held_to"), [
    ("1.0", "1.0"), ("1.2", "1.2"), ("1.0.3", "1.0"), (">=1.0,<3", devplug.CONTRACT_VERSION),
    (None, devplug.CONTRACT_VERSION),
])
def test_the_contract_a_plugin_is_held_to(declared, held_to):
    plugin = OldVendor()
    plugin.DEVPLUG_CONTRACT = declared  # type: ignore[misc]
    dut = open_device("oldvendor", _manager(plugin))
    assert dut.contract == held_to
    assert dut.holds_to("1.0")
    assert dut.holds_to("1.1") == (held_to != "1.0")


def test_every_check_names_a_contract_this_devplug_speaks():
    assert {spec.since for spec in registered_checks()} <= {"1.0", "1.1", "1.2", "1.3", "1.4", "1.5", "1.6", "1.7"}
    since = {spec.name: spec.since for spec in registered_checks()}
    assert since["to_device"] == "1.0"
    assert since["to_device_channels_last"] == "1.1"
    assert since["region_data_wait"] == "1.2"
    assert since["step_marks"] == "1.6"
    assert since["compile_plan"] == "1.7"
    with pytest.raises(ValueError, match="newer than the contract"):
        conformance_check("devplug_to_device", since="1.99")


class TestOldVendorConformance(DeviceConformance):
    """The pytest base class a third party's suite subclasses: the 1.0 plugin's suite still passes."""

    device_name = "oldvendor"
    require_available = True
    optimizer_names = ("sgd",)
    precisions = ("32-true",)

    def make_plugin_manager(self) -> DevplugPluginManager:
        return _manager(OldVendor())


def test_the_pytest_kit_skips_a_newer_check_that_fails_as_advisory():
    node = f"{__file__}::TestOldVendorConformance::test_to_device_channels_last"
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", node],
                            capture_output=True, text=True, timeout=300, cwd=Path(__file__).parent)
    assert result.returncode == 0, result.stdout
    assert "1 skipped" in result.stdout, result.stdout
    assert "advisory (introduced in contract 1.1; the plugin declares 1.0)" in result.stdout, result.stdout
