"""The kit's checks leave the process as they found it: what one check asked a plugin to do does not change
the checks after it."""

from __future__ import annotations

import os

import pytest
from standins import hpu_fixtures

from devplug.core.registry.manager import create_plugin_manager
from devplug.testing import open_device
from devplug.testing.checks.collectives import check_collective_setup
from devplug.testing.checks.training import check_training


@pytest.fixture
def standin_hpu(monkeypatch):
    yield from hpu_fixtures.standin(monkeypatch, lazy=False)


def test_the_collective_check_leaves_no_launch_behind_for_the_training_check(standin_hpu):
    """Gaudi's initialize_distributed_hpu() writes the two-process launch the check asks about into the
    environment; the Trainer of the next check must still see a single process."""
    before = dict(os.environ)
    dut = open_device("hpu", create_plugin_manager(autoload=False))
    assert check_collective_setup(dut).startswith("backend hccl")
    assert dict(os.environ) == before
    assert "loss" in check_training(dut, "32-true")


class _FakeAccelerator:
    """torch.accelerator's current-device API over a set of devices (as on a machine with several GPUs)."""

    def __init__(self) -> None:
        self.index = 0

    def is_available(self) -> bool:
        return True

    def current_device_index(self) -> int:
        return self.index

    def set_device_index(self, index: int) -> None:
        self.index = index


def test_the_collective_check_puts_back_the_current_device_its_hook_selected(monkeypatch):
    import torch

    import devplug

    accelerator = _FakeAccelerator()
    monkeypatch.setattr(torch, "accelerator", accelerator)

    class SelectsADevice:
        """Selects the pretend launch's device the way the CUDA plugin's torch.cuda.set_device does."""

        DEVPLUG_CONTRACT = devplug.CONTRACT_VERSION

        @devplug.hookimpl
        def devplug_collective_setup(self, device, launch):
            accelerator.set_device_index(launch.local_rank + 3)
            return devplug.CollectiveSetup(backend="gloo")

    pm = create_plugin_manager(autoload=False, extra_plugins=[("selects", SelectsADevice())])
    dut = open_device("cpu", pm)
    assert check_collective_setup(dut).startswith("backend gloo")
    assert accelerator.index == 0
