"""A third-party plugin that declares only a device (no other hook) trains through the core's generic paths.

The distribution ``devplug-hostaccel`` (pip-installed into a temporary target, offline) has one hook,
``devplug_register_devices``, declaring ``hostaccel`` on torch's ``cpu`` type. Everything else — the
fused optimizer, precision, loader, synchronize at log points and around the example's timings — is
the core fallback's, through PyTorch's device-generic API.
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

import devplug
from devplug.core.optim.torch_optimizers import torch_kernel

EXAMPLE = REPO / "examples" / "dcgan.py"

DEVICE_ONLY = '''
import devplug

DEVPLUG_CONTRACT = "1.1"


@devplug.hookimpl
def devplug_register_devices():
    return devplug.DeviceSpec(name="hostaccel", description="a device declared and nothing else", priority=-20,
                              probe=devplug.Availability.yes, torch_type="cpu")
'''

TINY = ["--device", "hostaccel", "--precision", "auto", "--no-progress", "--workers", "0", "--data", "fake",
        "--nz", "8", "--ngf", "4", "--ndf", "4", "--image-size", "16", "--batch-size", "4", "--steps", "3",
        "--log-every", "1"]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from conftest import _install_distribution

    target = tmp_path_factory.mktemp("hostaccel") / "site"
    return _install_distribution(target, "devplug-hostaccel", DEVICE_ONLY, {"hostaccel": "devplug_hostaccel"})


@pytest.fixture
def host_syncs(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Every ``torch.cpu.synchronize`` call (the generic wait for a cpu-typed device), recorded."""
    calls: list[object] = []
    real = torch.cpu.synchronize

    def synchronize(device: object = None) -> None:
        calls.append(device)
        real(device)

    monkeypatch.setattr(torch.cpu, "synchronize", synchronize)
    return calls


def expected_optimizer() -> str:
    kernel = torch_kernel("adam", "cpu")[0]
    return f"torch.optim.Adam({kernel}=True)" if kernel else "torch.optim.Adam"


@pytest.mark.skipif(not EXAMPLE.exists(), reason="examples/dcgan.py is not there")
def test_the_dcgan_example_trains_on_a_device_only_plugin_with_real_synchronizes(site, tmp_path, monkeypatch,
                                                                                  host_syncs):
    monkeypatch.syspath_prepend(str(site))
    devplug.reset_plugin_manager()
    from dcgan import train as example  # examples/dcgan/train.py, on pytest's pythonpath

    out = tmp_path / "run"
    assert example.main([*TINY, "--out", str(out), "--cache-dir", str(tmp_path / "cache")]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["device"], summary["device_plugin"], summary["steps"]) == ("hostaccel", "hostaccel", 3)
    assert summary["precision"] == "32-true"  # auto: torch.cpu reports no native bf16
    assert summary["optimizer_g"] == summary["optimizer_d"] == expected_optimizer()
    assert summary["images_per_sec"] > 0
    # one wait per log point (3 steps, --log-every 1) and more around the example's timings
    assert len(host_syncs) > 3 and set(host_syncs) == {torch.device("cpu")}


@pytest.mark.skipif(not EXAMPLE.exists(), reason="examples/dcgan.py is not there")
def test_the_dcgan_script_runs_on_the_installed_device_only_plugin(site, tmp_path):
    environ = {k: v for k, v in os.environ.items() if not k.startswith("DEVPLUG_")}
    environ["PYTHONPATH"] = os.pathsep.join([str(site), str(REPO)])
    result = subprocess.run([sys.executable, str(EXAMPLE), *TINY, "--out", str(tmp_path / "run"),
                             "--cache-dir", str(tmp_path / "cache")],
                            cwd=REPO, env=environ, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "device hostaccel (plugin hostaccel)" in result.stdout + result.stderr
    assert (tmp_path / "run" / "checkpoints" / "step_0000003.pt").exists()


def test_the_trainers_log_points_wait_through_the_generic_synchronize(site, monkeypatch, host_syncs):
    monkeypatch.syspath_prepend(str(site))
    trainer = devplug.Trainer(device="hostaccel", precision="auto", progress=False, log_every=2,
                              plugin_manager=devplug.create_plugin_manager())
    assert trainer.device.plugin_name == "hostaccel"
    model = trainer.setup(torch.nn.Linear(4, 1))
    opt = trainer.optimizer("adam", model.parameters(), lr=0.01)
    assert trainer.optimizer_implementation(opt) == expected_optimizer()
    data = torch.utils.data.TensorDataset(torch.randn(24, 4), torch.randn(24, 1))
    loader = trainer.dataloader(data, batch_size=4, num_workers=0)
    waits_at = []
    for _epoch in trainer.epochs(1):
        for x, y in loader:
            with trainer.autocast():
                loss = torch.nn.functional.mse_loss(model(x), y)
            trainer.backward(loss)
            trainer.step(opt)
            before = len(host_syncs)
            trainer.log(loss=loss)
            if len(host_syncs) > before:
                waits_at.append(trainer.global_step)
    assert waits_at == [2, 4, 6]  # every log point waits for the device, no other step does
    trainer.close()
