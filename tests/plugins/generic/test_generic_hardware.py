"""The generic plugin on real accelerators: marked per device type, skipped where the hardware is not.

``make check-device`` runs these (with the rest of the device-dependent tests, the DCGAN example and the
benchmarks) on whatever accelerator the machine has. Markers: ``mps``, ``xpu``, ``npu``, ``accelerator``
(any other renamed PrivateUse1 backend) and ``cuda`` (the generic plugin serving a GPU with the cuda
plugin blocked).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from paths import REPO

from devplug.core.registry.devices import DeviceRegistry
from devplug.core.registry.manager import DevplugPluginManager, create_plugin_manager
from devplug.plugins.generic.catalog import privateuse1_name
from devplug.testing import run_checks

EXAMPLE = REPO / "examples" / "dcgan.py"

_MARKED = {"mps": pytest.mark.mps, "xpu": pytest.mark.xpu, "npu": pytest.mark.npu}
_OTHER = privateuse1_name()
TYPES = [pytest.param(t, marks=mark) for t, mark in _MARKED.items()] + (
    [pytest.param(_OTHER, marks=pytest.mark.accelerator)] if _OTHER and _OTHER not in _MARKED else [])

def served_generically(device_type: str, pm: DevplugPluginManager) -> None:
    """Skip unless ``device_type`` is served by the generic plugin and usable on this machine."""
    entry = DeviceRegistry(pm).devices.get(device_type)
    if entry is None:
        pytest.skip(f"this torch knows no {device_type!r} device type")
    if entry.plugin_name != "generic":
        pytest.skip(f"{device_type} is served by plugin {entry.plugin_name!r}")
    availability = entry.availability()
    if not availability.available:
        pytest.skip(f"{device_type} is not available here: {availability.reason}")


def assert_all_checks_pass(device_type: str, pm: DevplugPluginManager) -> None:
    failed = [str(r) for r in run_checks(device_type, pm) if r.outcome != "passed"]
    assert failed == []


def run_dcgan(device_type: str, out: Path, **env: str) -> dict:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("DEVPLUG_")}
    environ.update(env)
    environ["PYTHONPATH"] = os.pathsep.join([str(REPO), environ.get("PYTHONPATH", "")])
    result = subprocess.run(
        [sys.executable, str(EXAMPLE), "--device", device_type, "--data", "fake", "--steps", "3", "--log-every", "1",
         "--no-progress", "--workers", "0", "--out", str(out), "--cache-dir", str(out.parent / "cache")],
        cwd=REPO, env=environ, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads((out / "summary.json").read_text())


@pytest.mark.parametrize("device_type", TYPES)
def test_the_conformance_kit_passes_on_the_real_device(device_type):
    pm = create_plugin_manager(autoload=False)
    served_generically(device_type, pm)
    assert_all_checks_pass(device_type, pm)


@pytest.mark.parametrize("device_type", TYPES)
def test_the_dcgan_example_trains_on_the_real_device(device_type, tmp_path):
    served_generically(device_type, create_plugin_manager())
    summary = run_dcgan(device_type, tmp_path / "run")
    assert (summary["device_plugin"], summary["steps"]) == ("generic", 3)


@pytest.mark.parametrize("device_type", TYPES)
def test_synchronize_goes_through_torch_accelerator_on_the_real_device(device_type, monkeypatch):
    import devplug

    pm = create_plugin_manager(autoload=False)
    served_generically(device_type, pm)
    calls = []
    real = torch.accelerator.synchronize
    monkeypatch.setattr(torch.accelerator, "synchronize", lambda device=None: calls.append(device) or real(device))
    trainer = devplug.Trainer(device=device_type, progress=False, plugin_manager=pm)
    trainer.synchronize()
    assert calls == [trainer.torch_device]
    trainer.close()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
def test_blocking_the_cuda_plugin_trains_the_dcgan_example_through_the_generic_plugin(tmp_path):
    summary = run_dcgan("cuda", tmp_path / "run", DEVPLUG_BLOCK_PLUGINS="cuda")
    assert (summary["device"], summary["device_plugin"], summary["steps"]) == ("cuda", "generic", 3)
    assert summary["optimizer_g"] == "torch.optim.Adam(fused=True)"  # torch's fused CUDA kernel, found by probing


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
def test_the_conformance_kit_passes_for_the_generic_plugin_on_a_gpu():
    pm = create_plugin_manager(autoload=False, blocked=["cuda"])
    served_generically("cuda", pm)
    assert_all_checks_pass("cuda", pm)
