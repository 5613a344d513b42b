"""The HPU plugin's availability probe and registration, with and without the Intel Gaudi stack."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from paths import REPO
from standins import hpu_fixtures

import devplug
from devplug.cli import devices_report
from devplug.core.registry.devices import DeviceRegistry
from devplug.core.registry.manager import create_plugin_manager
from devplug.plugins.hpu import probe


@pytest.fixture
def hpu(monkeypatch: pytest.MonkeyPatch):
    """The stand-in Gaudi stack, lazy mode, one device."""
    yield from hpu_fixtures.standin(monkeypatch)


def registry() -> DeviceRegistry:
    return DeviceRegistry(create_plugin_manager(autoload=False))


# ---- no Intel Gaudi software (this machine) ----------------------------------------------------------------
def test_without_habana_frameworks_the_probe_says_what_is_missing_and_how_to_install():
    assert "habana_frameworks" not in sys.modules
    availability = registry().devices["hpu"].availability()
    assert not availability.available
    assert availability.reason == "habana_frameworks (the Intel Gaudi PyTorch bridge) is not installed"
    assert "habanalabs-installer.sh install --type pytorch" in availability.fix
    assert "Installation_Guide" in availability.fix


def test_resolving_hpu_without_the_stack_is_one_clear_error():
    with pytest.raises(devplug.DeviceUnavailableError) as info:
        registry().resolve("hpu")
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("device 'hpu' is not available: habana_frameworks")
    assert "To fix: install the Intel Gaudi software stack" in message
    assert message.endswith("Available devices: cpu")


EXAMPLE = REPO / "examples" / "dcgan.py"


@pytest.mark.skipif(not EXAMPLE.exists(), reason="examples/dcgan.py is not there")
def test_dcgan_example_on_hpu_without_the_stack_prints_one_line_and_fails():
    run = subprocess.run([sys.executable, str(EXAMPLE), "--device", "hpu"], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode != 0
    assert run.stdout == ""
    (line,) = run.stderr.strip().splitlines()
    assert "habana_frameworks" in line and "install the Intel Gaudi software stack" in line
    assert "Available devices: cpu" in line and "Traceback" not in run.stderr


def test_devplug_devices_shows_hpu_unavailable_with_the_reason():
    report = devices_report(create_plugin_manager(autoload=False))
    row = next(line for line in report.splitlines() if line.startswith("hpu "))
    assert "unavailable" in row.split()
    assert "hpu: habana_frameworks (the Intel Gaudi PyTorch bridge) is not installed" in report


def test_shipped_plugin_places_tensors_on_torch_hpu():
    entry = registry().devices["hpu"]
    assert entry.spec.torch_type == "hpu" and entry.spec.priority > registry().devices["cuda"].spec.priority
    device = devplug.Device(spec=entry.spec, index=None, plugin_name="hpu")
    assert device.torch_device == torch.device("hpu")


# ---- with the stand-in -------------------------------------------------------------------------------------
def test_registration_imports_nothing_from_the_stack(hpu):
    registry()
    assert not [m for m in sys.modules if m.startswith(("habana_frameworks", "habana_dataloader"))]


def test_available_with_devices_and_preferred_by_auto(hpu):
    hpu.devices(8)
    reg = registry()
    assert reg.devices["hpu"].availability().available
    assert reg.devices["hpu"].count() == 8
    assert reg.resolve("auto").name == "hpu"
    assert reg.resolve("hpu:7").index == 7
    with pytest.raises(devplug.DeviceUnavailableError, match="8 hpu device"):
        reg.resolve("hpu:8")


def test_installed_but_no_device(hpu):
    hpu.devices(0)
    availability = probe.probe()
    assert availability.reason == "the Intel Gaudi software is installed but no Gaudi device is visible"
    assert "hl-smi" in availability.fix
    assert registry().resolve("auto").name == "cpu"


def test_installed_but_failing_to_load(hpu, monkeypatch):
    monkeypatch.setenv("HPU_STANDIN_IMPORT_ERROR",
                       "Error: Compile-time major/minor PyTorch version 2.6 differs from run-time 2.14.1.")
    availability = probe.probe()
    assert availability.reason == (
        "habana_frameworks.torch is installed but failed to load (AssertionError: Error: Compile-time "
        "major/minor PyTorch version 2.6 differs from run-time 2.14.1)"
    )
    assert "matches your Intel Gaudi software release" in availability.fix
