"""The CUDA plugin: probe reasons, optimizer choice (apex stand-in or torch), precision plans, TF32, hooks.

Most tests call the plugin's hook functions directly with a `devplug.Device` record, so they run
on this GPU-less machine with the real torch APIs that work without a device. Tests marked ``cuda``
need a GPU and skip without one; they run unchanged on a GPU machine.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import warnings

import attrs
import pytest
import torch
from paths import REPO, STANDINS

import devplug
from devplug.core.contract.records import (
    Availability,
    Device,
    DeviceSpec,
    LaunchInfo,
    LoaderChoice,
    LoaderOptions,
    Phase,
)
from devplug.core.errors import DeviceUnavailableError, OptimizerError, PrecisionError
from devplug.core.registry.devices import DeviceRegistry
from devplug.core.registry.manager import DevplugPluginManager, create_plugin_manager
from devplug.plugins.cuda import optimizers, precision, probe
from devplug.plugins.cuda import plugin as cuda_plugin
from devplug.testing import DeviceConformance

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")


def cuda_device(index: int | None = None, channels_last: bool = False, **options) -> Device:
    """A Device record as the core builds it for ``cuda`` (no GPU needed to build the record)."""
    spec = cuda_plugin.devplug_register_devices()
    return Device(spec=spec, index=index, plugin_name="cuda", options=options, channels_last=channels_last)


def _forget_apex(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(sys.modules):
        if name == "apex" or name.startswith("apex."):
            monkeypatch.delitem(sys.modules, name)


@pytest.fixture
def no_apex(monkeypatch: pytest.MonkeyPatch) -> None:
    """apex cannot be imported (even where some apex is installed)."""
    _forget_apex(monkeypatch)
    monkeypatch.setitem(sys.modules, "apex", None)


@pytest.fixture
def apex_standin(monkeypatch: pytest.MonkeyPatch):
    """The NVIDIA apex stand-in from tests/standins/apex_standin, importable as ``apex``; yields its optimizers."""
    _forget_apex(monkeypatch)
    monkeypatch.syspath_prepend(str(STANDINS / "apex_standin"))
    import apex.optimizers

    apex.optimizers.CALLS.clear()
    apex.optimizers.STEPS.clear()
    monkeypatch.setattr(apex.optimizers, "CUDA_EXTENSIONS", True)
    yield apex.optimizers
    _forget_apex(monkeypatch)


@pytest.fixture
def pypi_apex(monkeypatch: pytest.MonkeyPatch) -> None:
    """PyPI's unrelated ``apex`` (stand-in): importable, but without ``apex.optimizers``."""
    _forget_apex(monkeypatch)
    monkeypatch.syspath_prepend(str(STANDINS / "pypi_apex_standin"))
    yield
    _forget_apex(monkeypatch)


def tiny_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))


def one_step(optimizer: torch.optim.Optimizer, model: torch.nn.Module) -> None:
    loss = model(torch.randn(3, 4)).pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


# ---- registration and probe ---------------------------------------------------------------------------

def test_registering_and_probing_cuda_imports_neither_apex_nor_dali():
    code = (
        "import sys\n"
        "from devplug.core.registry.devices import DeviceRegistry\n"
        "registry = DeviceRegistry()\n"
        "registry.devices['cuda'].availability(); registry.devices['cuda'].count()\n"
        "print([m for m in sys.modules if m == 'apex' or m.startswith(('apex.', 'nvidia.dali'))])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, cwd=REPO)
    assert out.stdout.strip() == "[]"


def test_cuda_plugin_registers_one_device_and_declares_the_contract():
    spec = cuda_plugin.devplug_register_devices()
    assert isinstance(spec, DeviceSpec)
    assert (spec.name, spec.torch_type, spec.priority) == ("cuda", "cuda", 50)
    assert cuda_plugin.DEVPLUG_CONTRACT == devplug.CONTRACT_VERSION
    assert spec.count() == torch.cuda.device_count()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_probe_here_says_why_cuda_is_unavailable():
    answer = probe.probe()
    assert isinstance(answer, Availability) and not answer.available
    assert answer.reason and answer.fix
    assert any(word in answer.reason for word in ("driver", "GPU", "CPU-only", "CUDA_VISIBLE_DEVICES"))
    # and `--device cuda` is a clear error naming the reason and what is available instead
    with pytest.raises(DeviceUnavailableError, match="'cuda' is not available") as info:
        DeviceRegistry(create_plugin_manager()).resolve("cuda")
    assert answer.reason in str(info.value) and "cpu" in str(info.value)


def test_probe_reason_for_a_cpu_only_torch_build(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    answer = probe.probe()
    assert not answer.available
    assert "CPU-only" in answer.reason and "CUDA build of torch" in answer.fix


class FakeDriver:
    """libcuda as ctypes would load it: cuInit and cuDeviceGetCount return CUresult codes."""

    def __init__(self, init: int, count: int = 0) -> None:
        self.init, self.count = init, count

    def cuInit(self, flags: int) -> int:
        return self.init

    def cuDeviceGetCount(self, pointer) -> int:
        pointer._obj.value = self.count
        return 0


@pytest.mark.parametrize(
    ("driver", "expected"),
    [
        (None, "no NVIDIA driver found"),
        (FakeDriver(init=100), "sees no CUDA-capable GPU"),
        (FakeDriver(init=0, count=0), "sees no CUDA-capable GPU"),
        (FakeDriver(init=35), "older than the CUDA runtime"),
        (FakeDriver(init=999), "CUresult 999"),
    ],
    ids=["no-driver", "no-device", "zero-devices", "old-driver", "other"],
)
def test_probe_reasons_for_driver_and_device_problems(monkeypatch, driver, expected):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(probe, "_load_driver", lambda: driver)
    answer = probe.probe()
    assert not answer.available and expected in answer.reason and answer.fix


def test_probe_names_cuda_visible_devices_when_it_hides_every_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    answer = probe.probe()
    assert "CUDA_VISIBLE_DEVICES" in answer.reason


# ---- optimizers ---------------------------------------------------------------------------------------

@pytest.mark.usefixtures("no_apex")
@pytest.mark.parametrize(
    ("name", "implementation"),
    [
        ("adam", "torch.optim.Adam(fused=True)"),
        ("adamw", "torch.optim.AdamW(fused=True)"),
        ("sgd", "torch.optim.SGD(fused=True)"),
        ("adagrad", "torch.optim.Adagrad(fused=True)"),
        ("rmsprop", "torch.optim.RMSprop(foreach=True)"),
        ("nadam", "torch.optim.NAdam(foreach=True)"),
    ],
)
def test_without_apex_torch_fused_then_foreach_is_chosen(name, implementation):
    model = tiny_model()
    choice = cuda_plugin.devplug_optimizer(device=cuda_device(), name=name, params=model.parameters(),
                                           options={"lr": 0.01})
    assert choice.implementation == implementation
    assert type(choice.optimizer).__module__.startswith("torch.optim")
    if name in ("adam", "adamw", "sgd"):
        assert choice.reason == "NVIDIA apex is not installed"
        assert choice.optimizer.param_groups[0]["fused"] is True
    one_step(choice.optimizer, model)  # the CPU kernels of the same implementations run here


def test_unknown_optimizer_names_are_left_to_other_plugins():
    assert cuda_plugin.devplug_optimizer(device=cuda_device(), name="shampoo", params=tiny_model().parameters(),
                                         options={}) is None


@pytest.mark.usefixtures("no_apex")
def test_without_apex_lamb_is_a_clear_error_naming_apex():
    with pytest.raises(OptimizerError, match=r"lamb.*apex\.optimizers\.FusedLAMB.*not installed.*APEX_CUDA_EXT"):
        cuda_plugin.devplug_optimizer(device=cuda_device(), name="lamb", params=tiny_model().parameters(),
                                      options={})


def test_apex_fused_adam_for_adam_maps_options_with_adam_w_mode_off(apex_standin):
    model = tiny_model()
    choice = cuda_plugin.devplug_optimizer(device=cuda_device(), name="adam", params=model.parameters(),
                                           options={"lr": 2e-4, "betas": (0.5, 0.999)})
    assert isinstance(choice.optimizer, apex_standin.FusedAdam)
    assert choice.implementation == "apex.optimizers.FusedAdam(adam_w_mode=False)" and choice.reason == ""
    [(cls, kwargs)] = apex_standin.CALLS
    assert cls == "FusedAdam"
    # torch.optim.Adam's defaults fill what the author left out (apex's would differ for AdamW)
    mapped = {k: kwargs[k] for k in ("lr", "betas", "eps", "weight_decay", "adam_w_mode")}
    assert mapped == {"lr": 2e-4, "betas": (0.5, 0.999), "eps": 1e-8, "weight_decay": 0, "adam_w_mode": False}
    assert kwargs["set_grad_none"] is True
    before = [p.detach().clone() for p in model.parameters()]
    one_step(choice.optimizer, model)  # apex's zero_grad() takes no set_to_none; the plugin adapts it
    assert all(p.grad is None for p in model.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_apex_fused_adam_for_adamw_keeps_torch_adamw_weight_decay(apex_standin):
    choice = cuda_plugin.devplug_optimizer(device=cuda_device(), name="adamw", params=tiny_model().parameters(),
                                           options={"lr": 1e-3})
    assert choice.implementation == "apex.optimizers.FusedAdam(adam_w_mode=True)"
    [(_, kwargs)] = apex_standin.CALLS
    assert kwargs["adam_w_mode"] is True
    assert kwargs["weight_decay"] == 0.01  # torch.optim.AdamW's default, not FusedAdam's 0.0


def test_adam_with_decoupled_weight_decay_is_apex_adamw_mode(apex_standin):
    choice = cuda_plugin.devplug_optimizer(device=cuda_device(), name="adam", params=tiny_model().parameters(),
                                           options={"weight_decay": 0.1, "decoupled_weight_decay": True})
    assert choice.implementation == "apex.optimizers.FusedAdam(adam_w_mode=True)"
    assert apex_standin.CALLS[0][1]["weight_decay"] == 0.1


def test_apex_fused_sgd_gets_torch_defaults_and_set_grad_none(apex_standin):
    model = tiny_model()
    choice = cuda_plugin.devplug_optimizer(device=cuda_device(), name="sgd", params=model.parameters(),
                                           options={"momentum": 0.9, "nesterov": True})
    assert choice.implementation == "apex.optimizers.FusedSGD"
    [(cls, kwargs)] = apex_standin.CALLS
    assert cls == "FusedSGD"
    assert kwargs["lr"] == 1e-3  # apex requires lr; torch.optim.SGD's default is passed
    assert (kwargs["momentum"], kwargs["nesterov"], kwargs["dampening"]) == (0.9, True, 0)
    assert kwargs["set_grad_none"] is True  # FusedSGD would zero-fill; the Trainer sets grads to None
    one_step(choice.optimizer, model)
    assert all(p.grad is None for p in model.parameters())


def test_apex_fused_lamb_passes_its_own_options(apex_standin):
    choice = cuda_plugin.devplug_optimizer(device=cuda_device(), name="lamb", params=tiny_model().parameters(),
                                           options={"lr": 0.002, "max_grad_norm": 0.5})
    assert choice.implementation == "apex.optimizers.FusedLAMB"
    [(cls, kwargs)] = apex_standin.CALLS
    assert (cls, kwargs["lr"], kwargs["max_grad_norm"]) == ("FusedLAMB", 0.002, 0.5)


@pytest.mark.parametrize(
    ("options", "implementation", "reason"),
    [
        ({"amsgrad": True}, "torch.optim.Adam(fused=True)", "no equivalent of amsgrad=True"),
        ({"maximize": True}, "torch.optim.Adam(fused=True)", "no equivalent of maximize=True"),
        ({"foreach": True}, "torch.optim.Adam(foreach=True)", "torch's foreach implementation"),
        ({"fused": False}, "torch.optim.Adam(fused=False)", "torch's fused implementation"),
    ],
)
def test_options_apex_cannot_honour_go_to_torch_with_the_reason(apex_standin, options, implementation, reason):
    choice = cuda_plugin.devplug_optimizer(device=cuda_device(), name="adam", params=tiny_model().parameters(),
                                           options=options)
    assert choice.implementation == implementation
    assert reason in choice.reason
    assert apex_standin.CALLS == []


@pytest.mark.parametrize(("group", "reason"), [
    ({"amsgrad": True}, "no equivalent of amsgrad=True (in a parameter group)"),
    ({"maximize": True}, "no equivalent of maximize=True (in a parameter group)"),
    ({"decoupled_weight_decay": True, "weight_decay": 0.1}, "decoupled_weight_decay once for all parameter groups"),
])
def test_an_option_apex_cannot_honour_in_a_parameter_group_goes_to_torch(apex_standin, group, reason):
    model = tiny_model()
    params = [{"params": list(model[0].parameters())}, {"params": list(model[2].parameters()), **group}]
    choice = cuda_plugin.devplug_optimizer(device=cuda_device(), name="adam", params=params, options={})
    assert choice.implementation == "torch.optim.Adam(fused=True)" and reason in choice.reason
    assert apex_standin.CALLS == []
    assert choice.optimizer.param_groups[1][next(iter(group))] is True  # torch honours it


def test_a_parameter_groups_own_settings_and_keys_still_use_apex(apex_standin):
    model = tiny_model()
    params = [{"params": list(model[0].parameters()), "lr": 0.1, "weight_decay": 0.01, "name": "first"},
              {"params": list(model[2].parameters()), "amsgrad": False}]
    choice = cuda_plugin.devplug_optimizer(device=cuda_device(), name="adam", params=params, options={})
    assert choice.implementation.startswith("apex.optimizers.FusedAdam")


def test_amsgrad_false_and_other_torch_defaults_still_use_apex(apex_standin):
    choice = cuda_plugin.devplug_optimizer(device=cuda_device(), name="adam", params=tiny_model().parameters(),
                                           options={"amsgrad": False, "maximize": False})
    assert choice.implementation.startswith("apex.optimizers.FusedAdam")


def test_apex_without_cuda_extensions_falls_back_to_torch_fused(apex_standin, monkeypatch):
    monkeypatch.setattr(apex_standin, "CUDA_EXTENSIONS", False)
    choice = cuda_plugin.devplug_optimizer(device=cuda_device(), name="adam", params=tiny_model().parameters(),
                                           options={})
    assert choice.implementation == "torch.optim.Adam(fused=True)"
    assert "requires cuda extensions" in choice.reason and "APEX_CUDA_EXT=1" in choice.reason


def test_an_apex_that_refuses_to_build_leaves_the_authors_groups_to_torch_as_given(apex_standin, monkeypatch):
    monkeypatch.setattr(apex_standin, "CUDA_EXTENSIONS", False)  # apex fills in its defaults, then refuses
    model = tiny_model()
    params = [{"params": model[0].parameters(), "lr": 0.01}, {"params": model[2].parameters()}]
    choice = cuda_plugin.devplug_optimizer(device=cuda_device(), name="adam", params=params, options={})
    assert choice.implementation == "torch.optim.Adam(fused=True)"
    assert [len(group["params"]) for group in choice.optimizer.param_groups] == [2, 2]
    assert not any("bias_correction" in group for group in choice.optimizer.param_groups)  # apex's own key


def test_device_option_apex_false_skips_apex(apex_standin):
    choice = cuda_plugin.devplug_optimizer(device=cuda_device(apex=False), name="adam",
                                           params=tiny_model().parameters(), options={})
    assert choice.implementation == "torch.optim.Adam(fused=True)" and "apex=False" in choice.reason
    assert apex_standin.CALLS == []


@pytest.mark.usefixtures("pypi_apex")
def test_pypi_apex_without_optimizers_is_rejected_with_a_reason():
    status = optimizers.find_apex()
    assert not status.available
    assert "not NVIDIA apex" in status.reason and "apex.optimizers" in status.reason
    choice = cuda_plugin.devplug_optimizer(device=cuda_device(), name="adam", params=tiny_model().parameters(),
                                           options={})
    assert choice.implementation == "torch.optim.Adam(fused=True)"
    assert "not NVIDIA apex" in choice.reason


def test_an_apex_that_fails_to_import_is_reported_not_raised(monkeypatch, tmp_path):
    _forget_apex(monkeypatch)
    (tmp_path / "apex").mkdir()
    (tmp_path / "apex" / "__init__.py").write_text("from pyramid.security import Allow  # PyPI apex's imports\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    status = optimizers.find_apex()
    assert not status.available and "does not import" in status.reason and "PyPI" in status.reason
    _forget_apex(monkeypatch)


def test_a_generator_of_parameters_survives_a_failed_apex_attempt(apex_standin, monkeypatch):
    monkeypatch.setattr(apex_standin, "CUDA_EXTENSIONS", False)
    model = tiny_model()
    choice = cuda_plugin.devplug_optimizer(device=cuda_device(), name="adam", params=(p for p in model.parameters()),
                                           options={})
    assert len(choice.optimizer.param_groups[0]["params"]) == len(list(model.parameters()))


# ---- precision ------------------------------------------------------------------------------------------

def _autocast_of(plan) -> torch.autocast:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "CUDA is not available ... Disabling autocast" on GPU-less machines
        return plan.autocast()


def test_16_mixed_is_fp16_autocast_with_a_cuda_grad_scaler():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plan = cuda_plugin.devplug_precision(device=cuda_device(), precision="16-mixed", strategy="none")
    assert plan.name == "16-mixed"
    assert isinstance(plan.scaler, torch.amp.GradScaler) and plan.scaler._device == "cuda"
    ctx = _autocast_of(plan)
    assert (ctx.device, ctx.fast_dtype) == ("cuda", torch.float16)
    assert "GradScaler" in plan.description
    if not torch.cuda.is_available():
        # GradScaler("cuda") constructs without a GPU: it warns and disables itself, and its state is empty
        assert not plan.scaler.is_enabled()
        assert any("CUDA is not available" in str(w.message) for w in caught)


def test_bf16_mixed_is_bf16_autocast_without_a_scaler():
    plan = cuda_plugin.devplug_precision(device=cuda_device(), precision="bf16-mixed", strategy="none")
    assert plan.name == "bf16-mixed" and plan.scaler is None
    ctx = _autocast_of(plan)
    assert (ctx.device, ctx.fast_dtype) == ("cuda", torch.bfloat16)


def test_32_true_is_plain_fp32():
    plan = cuda_plugin.devplug_precision(device=cuda_device(), precision="32-true", strategy="none")
    assert plan.name == "32-true" and plan.scaler is None
    assert isinstance(plan.autocast(), contextlib.nullcontext)
    assert "TF32" in plan.description


@pytest.mark.filterwarnings("ignore:torch.cuda.amp.GradScaler is enabled, but CUDA is not available")
@pytest.mark.parametrize(("native_bf16", "expected"), [(True, "bf16-mixed"), (False, "16-mixed")])
def test_auto_is_bf16_where_the_gpu_has_it_else_fp16(monkeypatch, native_bf16, expected):
    monkeypatch.setattr(precision, "native_bf16", lambda: native_bf16)
    plan = cuda_plugin.devplug_precision(device=cuda_device(), precision="auto", strategy="none")
    assert plan.name == expected
    assert (plan.scaler is not None) == (expected == "16-mixed")
    assert "auto:" in plan.description


def test_native_bf16_is_false_without_a_gpu():
    if not torch.cuda.is_available():
        assert precision.native_bf16() is False


def test_unknown_precision_is_a_precision_error():
    with pytest.raises(PrecisionError, match="fp8"):
        cuda_plugin.devplug_precision(device=cuda_device(), precision="fp8", strategy="none")


@pytest.fixture
def restore_tf32():
    matmul, cudnn = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    yield
    torch.set_float32_matmul_precision(matmul)
    torch.backends.cudnn.allow_tf32 = cudnn


@pytest.mark.usefixtures("restore_tf32")
def test_tf32_on_for_ampere_and_newer_off_switch_and_untouched_before():
    torch.set_float32_matmul_precision("highest")
    torch.backends.cudnn.allow_tf32 = False
    assert "not available" in precision.configure_tf32(True, (7, 0))
    assert torch.get_float32_matmul_precision() == "highest" and not torch.backends.cudnn.allow_tf32
    assert "TF32 on" in precision.configure_tf32(True, (8, 0))
    assert torch.get_float32_matmul_precision() == "high" and torch.backends.cudnn.allow_tf32
    assert "off" in precision.configure_tf32(False, (9, 0))
    assert torch.get_float32_matmul_precision() == "highest" and not torch.backends.cudnn.allow_tf32
    # the long-standing API keeps the per-backend view readable (mixing the two APIs would raise)
    assert torch.backends.cuda.matmul.fp32_precision in ("ieee", "none", "tf32")


class FakeCudaRuntime:
    """Records torch.cuda calls device setup makes, standing in for a GPU at index 0..3."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, capability=(8, 0)) -> None:
        self.current = 0
        self.set_device_calls: list[int] = []
        monkeypatch.setattr(torch.cuda, "set_device", self.set_device)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: self.current)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: capability)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: "Fake A100")
        monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)

    def set_device(self, index) -> None:
        self.set_device_calls.append(int(index))
        self.current = int(index)


@pytest.mark.usefixtures("restore_tf32")
def test_device_setup_selects_the_gpu_and_enables_tf32_on_ampere(monkeypatch, caplog):
    runtime = FakeCudaRuntime(monkeypatch, capability=(8, 0))
    torch.set_float32_matmul_precision("highest")
    with caplog.at_level("INFO", logger="devplug"):
        cuda_plugin.devplug_device_setup(device=cuda_device(index=2))
    assert runtime.set_device_calls == [2]
    assert torch.get_float32_matmul_precision() == "high" and torch.backends.cudnn.allow_tf32
    assert "cuda:2 is Fake A100 (compute capability 8.0)" in caplog.text


@pytest.mark.usefixtures("restore_tf32")
def test_device_setup_tf32_off_switch(monkeypatch):
    runtime = FakeCudaRuntime(monkeypatch, capability=(9, 0))
    cuda_plugin.devplug_device_setup(device=cuda_device(tf32=False))
    assert runtime.set_device_calls == []  # no index: keep the current device (the launcher's choice)
    assert torch.get_float32_matmul_precision() == "highest" and not torch.backends.cudnn.allow_tf32


# ---- step, placement, collectives, compile ------------------------------------------------------------------

def test_region_is_an_nvtx_range_only_when_profiling():
    assert isinstance(cuda_plugin.devplug_region(device=cuda_device(), name="forward"), contextlib.nullcontext)
    region = cuda_plugin.devplug_region(device=cuda_device(profile=True), name="forward")
    assert not isinstance(region, contextlib.nullcontext)
    with region:  # NVTX ranges need the NVTX library, not a GPU
        pass


def test_mark_step_does_nothing():
    for phase in Phase:
        assert cuda_plugin.devplug_mark_step(device=cuda_device(), phase=phase) is None


def test_to_device_applies_channels_last_to_modules_and_4d_batches():
    # The plugin's placement logic on a cpu-typed copy of the cuda spec: no GPU is needed to check layout.
    spec = DeviceSpec(name="cuda", description="test", priority=50, probe=Availability.yes, torch_type="cpu")
    device = Device(spec=spec, index=None, plugin_name="cuda", channels_last=True)
    conv = cuda_plugin.devplug_to_device(device=device, obj=torch.nn.Conv2d(3, 4, 3))
    assert conv.weight.is_contiguous(memory_format=torch.channels_last)
    images, labels = cuda_plugin.devplug_to_device(device=device, obj=(torch.randn(2, 3, 5, 5), torch.tensor([1, 2])))
    assert images.is_contiguous(memory_format=torch.channels_last) and labels.shape == (2,)
    plain = Device(spec=spec, index=None, plugin_name="cuda", options={})
    images = cuda_plugin.devplug_to_device(device=plain, obj=torch.randn(2, 3, 5, 5))
    assert images.is_contiguous()


def test_collective_setup_is_nccl_on_the_local_rank_gpu(monkeypatch):
    runtime = FakeCudaRuntime(monkeypatch)
    setup = cuda_plugin.devplug_collective_setup(device=cuda_device(), launch=LaunchInfo(rank=5, world_size=8,
                                                                                        local_rank=1))
    assert setup.backend == "nccl"
    assert runtime.set_device_calls == [1]
    assert setup.ddp_kwargs["device_ids"] == [1] and setup.ddp_kwargs["output_device"] == 1


def test_collective_setup_with_one_visible_gpu_per_process(monkeypatch):
    runtime = FakeCudaRuntime(monkeypatch)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)  # CUDA_VISIBLE_DEVICES set per process
    setup = cuda_plugin.devplug_collective_setup(device=cuda_device(), launch=LaunchInfo(rank=3, world_size=4,
                                                                                        local_rank=3))
    assert runtime.set_device_calls == [0] and setup.ddp_kwargs["device_ids"] == [0]


def test_an_explicit_gpu_for_every_process_of_a_node_is_one_clear_line(monkeypatch):
    runtime = FakeCudaRuntime(monkeypatch)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    launch = LaunchInfo(rank=1, world_size=4, local_rank=1, local_world_size=4)
    with pytest.raises(devplug.ConfigError, match=r"device 'cuda:0' names one GPU for all 4 processes on this node.*"
                                                  r"give device='cuda'"):
        cuda_plugin.devplug_collective_setup(device=cuda_device(index=0), launch=launch)
    assert runtime.set_device_calls == []
    # one visible GPU per process (CUDA_VISIBLE_DEVICES set per process): cuda:0 is each process's own
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    setup = cuda_plugin.devplug_collective_setup(device=cuda_device(index=0), launch=launch)
    assert runtime.set_device_calls == [0] and setup.ddp_kwargs["device_ids"] == [0]
    # a single process: cuda:N is that GPU
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert cuda_plugin.devplug_collective_setup(device=cuda_device(index=2), launch=LaunchInfo()).ddp_kwargs[
        "device_ids"] == [2]


def test_compile_uses_cuda_graphs_mode_when_asked(monkeypatch):
    calls = []
    monkeypatch.setattr(torch, "compile", lambda module, **kw: calls.append(kw) or module)
    module = torch.nn.Linear(2, 2)
    assert cuda_plugin.devplug_compile(device=cuda_device(cuda_graphs=True), module=module, options={}) is module
    cuda_plugin.devplug_compile(device=cuda_device(cuda_graphs=True), module=module, options={"mode": "max-autotune"})
    cuda_plugin.devplug_compile(device=cuda_device(), module=module, options={"fullgraph": True})
    assert calls == [{"mode": "reduce-overhead"}, {"mode": "max-autotune"}, {"fullgraph": True}]


def test_compile_plan_is_inductor_with_cuda_graphs_on_request():
    plan = cuda_plugin.devplug_compile_plan(device=cuda_device())
    assert (plan.backend, plan.options) == ("inductor", {})
    plan = cuda_plugin.devplug_compile_plan(device=cuda_device(cuda_graphs=True))
    assert (plan.backend, plan.options) == ("inductor", {"mode": "reduce-overhead"})


def test_torch_loader_pins_memory_where_it_has_workers_unless_told():
    dataset = torch.utils.data.TensorDataset(torch.randn(8, 3))

    def pinned(device: Device = cuda_device(), **options) -> tuple[bool, LoaderChoice]:
        choice = cuda_plugin.devplug_dataloader(device=device, source=dataset,
                                                options=LoaderOptions(batch_size=4, **options))
        assert f"pin_memory={choice.loader.pin_memory}" in choice.implementation
        return choice.loader.pin_memory, choice

    assert pinned(num_workers=2)[0] is True  # pinned on the loader's own thread
    # without workers torch would pin in the main process, a host copy per batch: copied from pageable memory
    pin, choice = pinned(num_workers=0)
    assert pin is False and "not pinned, no worker processes" in choice.reason
    assert pinned(num_workers=0, pin_memory=True)[0] is True  # the author's word stands
    assert pinned(cuda_device(pin_memory=True), num_workers=0)[0] is True  # and the device option's
    assert pinned(num_workers=2, pin_memory=False)[0] is False
    assert pinned(cuda_device(pin_memory=False), num_workers=2)[0] is False


def test_to_device_copies_from_host_memory_without_waiting_pinned_or_not(monkeypatch):
    copies = []
    to = torch.Tensor.to

    def recorded(self, *args, **kwargs):
        copies.append((self.device.type, kwargs.get("non_blocking", False)))
        return to(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", recorded)
    spec = attrs.evolve(cuda_plugin.devplug_register_devices(), torch_type="meta")  # a device with no GPU
    device = Device(spec=spec, index=None, plugin_name="cuda")
    batch = (torch.randn(2, 3), torch.randn(2))  # pageable host memory, as a loader without workers yields
    moved = cuda_plugin.devplug_to_device(device=device, obj=batch)
    assert [t.device.type for t in moved] == ["meta", "meta"]
    assert copies == [("cpu", True), ("cpu", True)]
    copies.clear()
    cuda_plugin.devplug_to_device(device=device, obj={"x": torch.randn(2), "nested": [torch.randn(1)]})
    assert copies == [("cpu", True), ("cpu", True)]
    copies.clear()
    devplug.toolkit.move_to(batch, torch.device("meta"))  # other devices: blocking unless the source is pinned
    assert copies == [("cpu", False), ("cpu", False)]


# ---- checkpoints --------------------------------------------------------------------------------------------

def _cuda_grad_scaler(monkeypatch: pytest.MonkeyPatch) -> torch.amp.GradScaler:
    """The CUDA plugin's 16-mixed scaler, enabled even here.

    GradScaler("cuda") disables itself when no GPU is visible; letting it see one while it is built keeps
    it enabled. Its state (scale, growth tracker, factors) lives on the host until the first ``scale()``,
    which is all a checkpoint round trip touches.
    """
    with monkeypatch.context() as patch:
        patch.setattr(torch.cuda, "is_available", lambda: True)
        plan = cuda_plugin.devplug_precision(device=cuda_device(), precision="16-mixed", strategy="none")
    assert plan.scaler.is_enabled() and plan.scaler._device == "cuda"
    return plan.scaler


def test_grad_scaler_state_round_trips_through_a_trainer_checkpoint(monkeypatch, tmp_path):
    # The Trainer runs on the cpu device here; its scaler is replaced by the CUDA plugin's plan scaler,
    # which is exactly what Trainer.save/load write and restore.
    saved_state = {"scale": 1024.0, "growth_factor": 3.0, "backoff_factor": 0.25, "growth_interval": 7,
                   "_growth_tracker": 5}

    def make_trainer():
        trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False)
        trainer.scaler = _cuda_grad_scaler(monkeypatch)
        model = trainer.setup(tiny_model(), name="net")
        trainer.optimizer("adam", model.parameters(), lr=1e-3)
        return trainer

    first = make_trainer()
    first.scaler.load_state_dict(saved_state)
    path = first.save(tmp_path / "ckpt.pt")
    second = make_trainer()
    assert second.scaler.state_dict() != saved_state
    second.load(path)
    assert second.scaler.state_dict() == saved_state
    assert torch.load(path, weights_only=True)["scaler"] == saved_state


# ---- on a GPU ------------------------------------------------------------------------------------------------

@pytest.mark.cuda
@needs_gpu
def test_gpu_probe_count_memory_and_synchronize():
    assert probe.probe().available and probe.device_count() == torch.cuda.device_count() >= 1
    assert torch.cuda.get_device_name(0)
    device = cuda_device(index=0)
    assert cuda_plugin.devplug_synchronize(device=device) is True
    stats = cuda_plugin.devplug_memory_stats(device=device)
    assert stats.total > 0 and stats.allocated is not None and stats.peak_allocated >= stats.allocated


@pytest.mark.cuda
@needs_gpu
def test_gpu_to_device_copies_pinned_and_pageable_memory_intact():
    device = cuda_device(index=0, channels_last=True)
    pinned = torch.randn(4, 3, 8, 8).pin_memory()
    moved = cuda_plugin.devplug_to_device(device=device, obj=pinned)
    torch.cuda.synchronize()  # a pinned source is read when the copy runs: wait before reusing it
    assert moved.is_cuda and moved.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(moved.cpu(), pinned)
    pageable = torch.randn(4, 3, 8, 8)
    expected = pageable.clone()
    moved = cuda_plugin.devplug_to_device(device=device, obj=pageable)
    pageable.zero_()  # staged before the call returned: the host may reuse its memory at once
    torch.cuda.synchronize()
    assert moved.is_contiguous(memory_format=torch.channels_last) and torch.equal(moved.cpu(), expected)


@pytest.mark.cuda
@needs_gpu
def test_gpu_trainer_picks_a_fused_optimizer():
    trainer = devplug.Trainer(device="cuda", precision="auto", progress=False)
    model = trainer.setup(tiny_model())
    optimizer = trainer.optimizer("adam", model.parameters(), lr=1e-3)
    implementation = trainer.optimizer_implementation(optimizer)
    assert implementation.startswith("apex.optimizers.FusedAdam") or implementation.endswith("(fused=True)")


@pytest.mark.cuda
@needs_gpu
@pytest.mark.parametrize("precision_name", ["16-mixed", "bf16-mixed"])
def test_gpu_steady_state_step_does_not_synchronize(precision_name):
    if precision_name == "bf16-mixed" and not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bf16")
    # apex's non-capturable FusedAdam makes GradScaler read found_inf on the host every step; torch's
    # fused Adam takes it on the device, so the sync-free check uses the torch implementation.
    trainer = devplug.Trainer(device="cuda", precision=precision_name, progress=False, log_every=1000,
                              device_options={"apex": False})
    model = trainer.setup(torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                                              torch.nn.LazyLinear(1)))
    x = torch.randn(16, 3, 16, 16, device=trainer.torch_device)
    model(x)  # materialise the lazy layer before building the optimizer
    optimizer = trainer.optimizer("adam", model.parameters(), lr=1e-3)
    assert trainer.optimizer_implementation(optimizer) == "torch.optim.Adam(fused=True)"

    def step() -> None:
        with trainer.autocast():
            loss = model(x).float().pow(2).mean()
        trainer.backward(loss)
        trainer.step(optimizer)
        trainer.log(loss=loss)

    for _ in range(3):  # warm-up: allocator, cuDNN autotuning, lazy state
        step()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()


@pytest.mark.cuda
@needs_gpu
@pytest.mark.parametrize(
    ("precision_name", "data"),
    [("16-mixed", "shapes"), ("bf16-mixed", "shapes"), ("16-mixed", "folder")],
    ids=["16-mixed", "bf16-mixed", "16-mixed-image-folder"],
)
def test_gpu_dcgan_example_runs_a_few_steps(tmp_path, precision_name, data):
    example = REPO / "examples" / "dcgan.py"
    if not example.exists():
        pytest.skip("examples/dcgan.py is not there yet")
    if precision_name == "bf16-mixed" and not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bf16")
    args = ["--data", "shapes"]
    if data == "folder":  # an uncached image folder goes to the plugin's loader: DALI where installed
        from PIL import Image

        (tmp_path / "images").mkdir()  # beside the run folder: an --out inside --data is refused
        for i in range(40):
            Image.new("RGB", (48 + i, 40), (6 * i, 100, 200)).save(tmp_path / "images" / f"{i}.jpg")
        args = ["--data", str(tmp_path / "images"), "--no-cache"]
    result = subprocess.run(
        [sys.executable, str(example), "--device", "cuda", "--steps", "3", "--precision", precision_name,
         "--batch-size", "16", "--image-size", "32", "--out", str(tmp_path / "run"), "--no-progress", *args],
        capture_output=True, text=True, cwd=REPO, timeout=600,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]


@pytest.mark.cuda
@needs_gpu
def test_gpu_grad_scaler_round_trips_through_a_real_cuda_trainer(tmp_path):
    def make_trainer():
        trainer = devplug.Trainer(device="cuda", precision="16-mixed", progress=False)
        model = trainer.setup(tiny_model(), name="net")
        optimizer = trainer.optimizer("adam", model.parameters(), lr=1e-3)
        return trainer, model, optimizer

    trainer, model, optimizer = make_trainer()
    for _ in range(3):
        with trainer.autocast():
            loss = model(torch.randn(4, 4, device="cuda")).pow(2).mean()
        trainer.backward(loss)
        trainer.step(optimizer)
    path = trainer.save(tmp_path / "ckpt.pt")
    other, _, _ = make_trainer()
    other.load(path)
    assert other.scaler.state_dict() == trainer.scaler.state_dict()


# ---- the conformance kit ------------------------------------------------------------------------------------

class TestCudaConformance(DeviceConformance):
    """devplug's device conformance checks on the CUDA plugin: registration here, the rest on a GPU."""

    device_name = "cuda"

    def make_plugin_manager(self) -> DevplugPluginManager:
        """Built-in plugins only."""
        return create_plugin_manager(autoload=False)


def test_fp8_skip_given_as_one_name_skips_that_layer_not_every_layer_with_one_of_its_letters():
    pytest.importorskip("torchao")
    device = Device(spec=cuda_plugin.devplug_register_devices(), index=None, plugin_name="cuda",
                    options={"fp8_small_layers": True, "fp8_skip": "named"})
    plan = precision.plan_fp8(device, (9, 0))
    model = torch.nn.Sequential()
    model.add_module("encoder", torch.nn.Linear(32, 64))
    model.add_module("named", torch.nn.Linear(64, 32))
    assert plan.convert_module is not None
    model = plan.convert_module(model) or model
    assert [name for name, m in model.named_modules() if type(m).__name__ == "Float8Linear"] == ["encoder"]
    with pytest.raises(PrecisionError, match=r"^device option fp8_skip=3: give a layer name or a list of them"):
        precision.plan_fp8(attrs.evolve(device, options={"fp8_skip": 3}), (9, 0))
