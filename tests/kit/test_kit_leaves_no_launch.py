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
