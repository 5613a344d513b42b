"""The template plugin's own tests: devplug's conformance kit, plus what is particular to this plugin.

Run them after installing the package (``pip install -e .``): ``pytest``.
"""

from __future__ import annotations

import pytest
import torch
from devplug_template_device import device as cpusim
from devplug_template_device import stepcount

import devplug
from devplug.testing import DeviceConformance


class TestCpusimConformance(DeviceConformance):
    """Every check of the hook contract, against the installed entry points."""

    device_name = "cpusim"


def test_refuses_fp16_with_a_clear_error():
    with pytest.raises(devplug.PrecisionError, match="no fp16"):
        devplug.Trainer(device="cpusim", precision="16-mixed", progress=False)


def test_trainer_uses_the_plugin_and_the_step_counter_sees_every_step():
    pm = devplug.create_plugin_manager()
    before_marks, before_steps = sum(cpusim.MARKED.values()), stepcount.steps("cpusim")
    trainer = devplug.Trainer(device="cpusim", precision="32-true", progress=False, plugin_manager=pm)
    model = trainer.setup(torch.nn.Linear(3, 1))
    opt = trainer.optimizer("adam", model.parameters(), lr=0.01)
    for _ in range(3):
        trainer.backward(model(trainer.to_device(torch.ones(2, 3))).sum())
        trainer.step(opt)
    assert trainer.torch_device.type == "cpu" and str(trainer.device) == "cpusim"
    assert trainer.optimizer_implementation(opt) == "torch.optim.Adam(foreach=True)"
    assert sum(cpusim.MARKED.values()) - before_marks == 6  # after backward and after each step
    assert stepcount.steps("cpusim") - before_steps == 3


def test_probe_reports_why_when_disabled(monkeypatch):
    monkeypatch.setenv(cpusim.ENV_DISABLE, "1")
    with pytest.raises(devplug.DeviceUnavailableError, match="CPUSIM_DISABLE is set"):
        devplug.Trainer(device="cpusim", progress=False)
