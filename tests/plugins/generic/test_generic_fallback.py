"""The core fallback is device-generic: what it does for a device whose plugin declares only the device.

Each answer comes from PyTorch's device-generic API for the device's torch type, checked here on the
CPU for real and, where a type this machine lacks is needed, with ``standins.fake_accelerator``.
"""

from __future__ import annotations

import logging
import types

import pytest
import torch
from standins.fake_accelerator import fake_accelerator

from devplug import Availability, Device, DeviceSpec, LaunchInfo, MemoryStats, PrecisionError
from devplug.core.checkpoint import rng
from devplug.core.fallback import accelerator
from devplug.core.fallback import plugin as fallback
from devplug.core.optim.torch_optimizers import torch_kernel


def device(torch_type: str, index: int | None = None) -> Device:
    spec = DeviceSpec(name="dev", description="", priority=0, probe=Availability.yes, torch_type=torch_type)
    return Device(spec=spec, index=index, plugin_name="dev")


# ---- synchronize ----------------------------------------------------------------------------------------
def test_synchronize_waits_through_the_device_module_of_a_host_type(monkeypatch):
    calls = []
    real = torch.cpu.synchronize
    monkeypatch.setattr(torch.cpu, "synchronize", lambda device=None: calls.append(device) or real(device))
    assert fallback.devplug_synchronize(device("cpu")) is True
    assert calls == [torch.device("cpu")]


def test_synchronize_says_false_where_torch_has_no_way_to_wait():
    assert accelerator.device_module("hpu") is None  # no Gaudi bridge here
    assert fallback.devplug_synchronize(device("hpu")) is False


def test_synchronize_uses_torch_accelerator_for_the_current_accelerator_only(monkeypatch):
    fake = fake_accelerator(monkeypatch, "mtia")
    assert fallback.devplug_synchronize(device("mtia", 1)) is True
    assert fake.calls.of("torch.accelerator.synchronize") == [(torch.device("mtia", 1),)]
    fake.calls.clear()
    fallback.devplug_synchronize(device("cpu"))
    assert "torch.accelerator.synchronize" not in fake.calls.names()


def test_a_module_synchronize_without_arguments_is_called_without_one(monkeypatch):
    calls = []
    module = types.SimpleNamespace(synchronize=lambda: calls.append("waited"))
    monkeypatch.setattr(accelerator, "device_module", lambda device_type: module)
    monkeypatch.setattr(accelerator, "current_accelerator_type", lambda: None)
    assert accelerator.synchronize(torch.device("cpu")) is True and calls == ["waited"]


# ---- memory statistics ----------------------------------------------------------------------------------
def test_memory_stats_are_none_where_torch_reports_nothing():
    assert fallback.devplug_memory_stats(device("cpu")) is None


def test_memory_stats_leave_out_figures_the_device_cannot_give(monkeypatch):
    fake = fake_accelerator(monkeypatch, "mtia")

    def unsupported(device=None):
        raise RuntimeError("memory_reserved is not supported on this device")

    monkeypatch.setattr(torch.accelerator, "memory_reserved", unsupported)
    stats = fallback.devplug_memory_stats(device("mtia"))
    assert stats == MemoryStats(allocated=1 << 20, reserved=None, peak_allocated=3 << 20, total=16 << 30)
    assert fake.calls.of("torch.accelerator.memory_allocated") == [(torch.device("mtia"),)]


# ---- device selection and collective backend -------------------------------------------------------------
def test_the_collective_backend_comes_from_torchs_backend_map():
    backends = torch.distributed.Backend.default_device_backend_map
    assert accelerator.collective_backend("cpu") == backends["cpu"] == "gloo"
    assert accelerator.collective_backend("cuda") == backends["cuda"]
    assert "nosuchtype" not in backends and accelerator.collective_backend("nosuchtype") == "gloo"
    launch = LaunchInfo(rank=1, world_size=2, local_rank=1, local_world_size=2)
    assert fallback.devplug_collective_setup(device("cpu"), launch).backend == "gloo"


def test_device_setup_selects_an_explicit_index_only(monkeypatch):
    fake = fake_accelerator(monkeypatch, "mtia")
    fallback.devplug_device_setup(device("mtia"))
    assert fake.calls.of("torch.accelerator.set_device_index") == []
    fallback.devplug_device_setup(device("mtia", 1))
    assert fake.calls.of("torch.accelerator.set_device_index") == [(1,)]


# ---- precision ---------------------------------------------------------------------------------------------
def test_auto_precision_is_fp32_where_the_type_does_not_report_native_bf16():
    plan = fallback.devplug_precision(device("cpu"), "auto")
    assert plan.name == "32-true" and plan.scaler is None
    assert plan.description == "full fp32 (auto: torch has no torch.cpu.is_bf16_supported())"


def test_auto_precision_is_fp32_where_torch_has_no_autocast_for_the_type():
    assert not torch.amp.is_autocast_available("meta")
    plan = fallback.devplug_precision(device("meta"), "auto")
    assert plan.name == "32-true" and "auto: torch has no autocast for device type 'meta'" in plan.description
    with pytest.raises(PrecisionError, match="no autocast for device type 'meta'"):
        fallback.devplug_precision(device("meta"), "bf16-mixed")


def test_auto_precision_is_fp32_when_the_module_says_no_native_bf16(monkeypatch):
    fake = fake_accelerator(monkeypatch, "mtia")
    monkeypatch.setattr(fake.module, "is_bf16_supported", lambda including_emulation=True: False)
    plan = fallback.devplug_precision(device("mtia"), "auto")
    assert plan.name == "32-true" and "is_bf16_supported(including_emulation=False) is False" in plan.description


def test_fp16_gets_a_grad_scaler_and_bf16_none():
    assert isinstance(fallback.devplug_precision(device("cpu"), "16-mixed").scaler, torch.amp.GradScaler)
    assert fallback.devplug_precision(device("cpu"), "bf16-mixed").scaler is None


# ---- optimizers ----------------------------------------------------------------------------------------------
def _params() -> list[torch.nn.Parameter]:
    return list(torch.nn.Linear(3, 2).parameters())


@pytest.mark.parametrize("name", ["adam", "adamw", "sgd", "adagrad", "rmsprop", "nadam"])
def test_the_optimizer_uses_torchs_fastest_kernel_for_the_type(name):
    choice = fallback.devplug_optimizer(device("cpu"), name, _params(), {"lr": 0.01})
    cls_name = type(choice.optimizer).__name__
    group = choice.optimizer.param_groups[0]
    if group.get("fused"):
        assert choice.implementation == f"torch.optim.{cls_name}(fused=True)" and choice.reason == ""
    else:
        assert group.get("foreach") is True and choice.implementation == f"torch.optim.{cls_name}(foreach=True)"
        assert f"torch.optim.{cls_name} has no fused option" in choice.reason
    assert group["lr"] == 0.01


def test_fused_is_probed_once_per_name_and_type():
    torch_kernel.cache_clear()
    for _ in range(3):
        fallback.devplug_optimizer(device("cpu"), "adam", _params(), {})
        fallback.devplug_optimizer(device("cpu"), "sgd", _params(), {})
    assert torch_kernel.cache_info().misses == 2


def test_the_authors_kernel_choice_is_kept():
    choice = fallback.devplug_optimizer(device("cpu"), "adam", _params(), {"foreach": False, "lr": 0.1})
    assert choice.implementation == "torch.optim.Adam(foreach=False)"
    assert choice.optimizer.param_groups[0]["foreach"] is False and not choice.optimizer.param_groups[0]["fused"]


def test_options_the_fused_kernel_refuses_fall_back_to_the_default_with_the_reason():
    choice = fallback.devplug_optimizer(device("cpu"), "adam", _params(), {"differentiable": True})
    if torch_kernel("adam", "cpu")[0] != "fused":
        pytest.skip("this torch has no fused CPU Adam")
    assert choice.implementation == "torch.optim.Adam" and "fused=True does not take these options" in choice.reason


def test_a_type_without_tensors_here_gets_the_default_optimizer_and_says_why():
    torch_kernel.cache_clear()
    choice = fallback.devplug_optimizer(device("mtia"), "adam", [torch.nn.Parameter(torch.zeros(1))], {})
    assert choice.implementation == "torch.optim.Adam"
    assert "no tensor could be placed on 'mtia' to probe torch's kernels" in choice.reason


# ---- RNG state for checkpoints ---------------------------------------------------------------------------------
class OneDevice:
    """A device module with one generator (``get_rng_state``/``set_rng_state``, as ``torch.mps`` has)."""

    def __init__(self) -> None:
        self.state = torch.arange(4, dtype=torch.uint8)

    def get_rng_state(self) -> torch.Tensor:
        return self.state.clone()

    def set_rng_state(self, state: torch.Tensor) -> None:
        self.state = state.clone()


class PerDevice(OneDevice):
    """A device module with per-device generators (``get_rng_state_all``, as ``torch.cuda`` and ``torch.xpu``)."""

    def __init__(self, count: int = 2) -> None:
        super().__init__()
        self.states = [torch.full((4,), i, dtype=torch.uint8) for i in range(count)]

    def get_rng_state_all(self) -> list[torch.Tensor]:
        return [s.clone() for s in self.states]

    def set_rng_state_all(self, states: list[torch.Tensor]) -> None:
        self.states = [s.clone() for s in states]


def test_a_single_generator_module_is_saved_and_restored():
    module = OneDevice()
    state = rng.rng_state(module)
    assert len(state["device"]) == 1 and torch.equal(state["device"][0], torch.arange(4, dtype=torch.uint8))
    module.state = torch.zeros(4, dtype=torch.uint8)
    rng.restore_rng_state(state, module)
    assert torch.equal(module.state, torch.arange(4, dtype=torch.uint8))


def test_per_device_generators_are_preferred_and_restored():
    module = PerDevice()
    state = rng.rng_state(module)
    assert [int(s[0]) for s in state["device"]] == [0, 1]
    module.states = [torch.zeros(4, dtype=torch.uint8)] * 2
    rng.restore_rng_state(state, module)
    assert [int(s[0]) for s in module.states] == [0, 1]


def test_several_saved_states_do_not_go_into_a_single_generator(caplog):
    state = rng.rng_state(PerDevice())
    module = OneDevice()
    with caplog.at_level(logging.WARNING, logger="devplug"):
        rng.restore_rng_state(state, module)
    assert torch.equal(module.state, torch.arange(4, dtype=torch.uint8))
    assert "2 device RNG states saved, this device module keeps one" in caplog.text


def test_a_host_type_saves_no_device_state():
    assert "device" not in rng.rng_state(rng.device_module("cpu"))
