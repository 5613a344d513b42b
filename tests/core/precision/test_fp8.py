"""fp8-mixed: torchao's float8 training emulated on the CPU end to end, the refusals that name fp8 hardware, the
CUDA plugin's recipe and layer filter, fp8 datasheet peaks, and checkpoints that move between fp8 and bf16."""

from __future__ import annotations

import pytest
import torch
from toys import train_byte_lm

import devplug
from devplug import PrecisionError
from devplug.core.registry.manager import create_plugin_manager
from devplug.plugins.cuda import peaks as cuda_peaks
from devplug.plugins.cuda import plugin as cuda_plugin
from devplug.plugins.cuda.precision import plan_fp8
from devplug.plugins.hpu import peaks as hpu_peaks
from devplug.testing import open_device
from devplug.testing.checks.precision import check_precision
from devplug.toolkit import PrecisionParams, float8_conversion, pays_off, precision_named

from lm.models import ModelSpec  # examples/lm

pytest.importorskip("torchao")

EMULATE = {"fp8": "emulate"}
SPEC = ModelSpec(width=32, layers=1, heads=2, context=16)


def float8_layers(module: torch.nn.Module) -> int:
    return sum(type(m).__name__ == "Float8Linear" for m in module.modules())


def test_a_cpu_refuses_fp8_in_one_line_naming_the_hardware_that_has_it():
    with pytest.raises(PrecisionError) as caught:
        devplug.Trainer(device="cpu", precision="fp8-mixed", progress=False)
    message = str(caught.value)
    assert "\n" not in message and "this CPU" in message
    assert "H100" in message and "Gaudi 2" in message and "compute capability 8.9" in message


def test_a_gpu_older_than_ada_refuses_fp8_naming_its_compute_capability():
    device = devplug.Device.__new__(devplug.Device)  # plan_fp8 reads nothing from it before refusing
    with pytest.raises(PrecisionError, match=r"this GPU \(compute capability 8\.0\) lacks: .*H100"):
        plan_fp8(device, (8, 0))


def cuda_fp8_weights(strategy: str, **options: object) -> tuple[list[str], str]:
    """The CUDA plugin's fp8 plan for ``strategy`` (on a Hopper-class capability, no GPU needed to convert):
    the type names of a converted model's weights, and the plan's description."""
    device = devplug.Device(spec=cuda_plugin.devplug_register_devices(), index=None, plugin_name="cuda",
                            options={"fp8_small_layers": True, **options})
    plan = plan_fp8(device, (9, 0), strategy)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32))
    assert plan.convert_module is not None
    model = plan.convert_module(model) or model
    assert float8_layers(model) == 2
    return [type(p).__name__ for p in model.parameters() if p.dim() == 2], plan.description


@pytest.mark.parametrize("strategy", ["none", "ddp", "tp"])
def test_cuda_fp8_keeps_plain_weights_where_nothing_shards_them(strategy):
    # the fp8-gathering wrapper would put every op on the weights (the optimizer's too) through __torch_dispatch__
    weights, description = cuda_fp8_weights(strategy)
    assert weights == ["Parameter", "Parameter"]
    assert "not gathered in fp8" in description


@pytest.mark.parametrize("strategy", ["fsdp", "fsdp+tp"])
def test_cuda_fp8_gathers_weights_in_fp8_under_fsdp(strategy):
    weights, description = cuda_fp8_weights(strategy)
    assert weights == ["WeightWithDynamicFloat8CastTensor"] * 2
    assert "FSDP gathers the weights in fp8" in description


def test_an_explicit_fp8_all_gather_is_obeyed_and_a_bad_one_refused_in_one_line():
    assert cuda_fp8_weights("none", fp8_all_gather=True)[0] == ["WeightWithDynamicFloat8CastTensor"] * 2
    weights, description = cuda_fp8_weights("fsdp", fp8_all_gather=False)
    assert weights == ["Parameter", "Parameter"] and "not fp8" in description
    assert cuda_fp8_weights("fsdp", fp8_recipe="rowwise")[0] == ["Parameter", "Parameter"]  # tensorwise only
    with pytest.raises(PrecisionError, match=r"^device option fp8_all_gather='yes' is not one of 'auto', true, "
                                             r"false$"):
        cuda_fp8_weights("fsdp", fp8_all_gather="yes")


def test_the_toolkit_conversion_leaves_weights_plain_unless_asked_to_gather_them_in_fp8():
    def weights(**options: object) -> list[str]:
        model = float8_conversion(small_layers=True, **options)(torch.nn.Sequential(torch.nn.Linear(32, 32)))
        return [type(p).__name__ for p in model.parameters() if p.dim() == 2]

    assert weights() == ["Parameter"]
    assert weights(fp8_all_gather=True) == ["WeightWithDynamicFloat8CastTensor"]


class StrategySeen:
    """A device-neutral plugin that records the strategy the precision hook is told, and plans nothing."""

    DEVPLUG_CONTRACT = devplug.CONTRACT_VERSION

    def __init__(self) -> None:
        self.seen: list[str] = []

    @devplug.hookimpl
    def devplug_precision(self, strategy: str) -> None:
        self.seen.append(strategy)


@pytest.mark.parametrize(("asked", "told"), [("auto", "none"), ("ddp", "none"), ("fsdp", "fsdp")])
def test_the_trainer_tells_the_precision_hook_its_resolved_strategy(asked, told):
    seen = StrategySeen()
    pm = create_plugin_manager(autoload=False, extra_plugins=[("strategy-seen", seen)])
    trainer = devplug.Trainer(device="cpu", strategy=asked, progress=False, plugin_manager=pm)
    assert seen.seen == [told] and trainer.strategy == told
    trainer.close()


def test_fp8_converts_only_layers_where_it_pays():
    def linear(n_out: int, n_in: int) -> torch.nn.Module:
        with torch.device("meta"):
            return torch.nn.Linear(n_in, n_out)

    assert pays_off(linear(4096, 4096), "mlp", "tensorwise") and pays_off(linear(8192, 4096), "mlp", "rowwise")
    assert not pays_off(linear(1024, 4096), "mlp", "tensorwise")  # both small: the casts cost more
    assert not pays_off(linear(2048, 4096), "mlp", "rowwise")
    assert not pays_off(linear(4096, 4100), "mlp", "tensorwise")  # not divisible by 16
    assert not pays_off(linear(4096, 4096), "head", "tensorwise", skip=("head",))


def test_fp8_peaks_come_from_the_datasheets():
    assert cuda_peaks.peak_flops("NVIDIA H100 80GB HBM3", "fp8-mixed") == pytest.approx(1978.9e12)
    assert cuda_peaks.peak_flops("NVIDIA H200", "fp8-mixed") == pytest.approx(1978.9e12)
    assert cuda_peaks.peak_flops("NVIDIA A100-SXM4-80GB", "fp8-mixed") is None  # Ampere has no fp8
    assert hpu_peaks.peak_flops("GAUDI2", "fp8-mixed") == pytest.approx(865e12)
    assert hpu_peaks.peak_flops("GAUDI3", "fp8-mixed") == pytest.approx(1835e12)
    assert hpu_peaks.peak_flops("GAUDI", "fp8-mixed") is None


def test_the_kit_checks_the_cpu_plugins_fp8_answer_emulated_and_refused():
    dut = open_device("cpu", create_plugin_manager(autoload=False), options=EMULATE)
    assert check_precision(dut, "fp8-mixed").startswith("fp8-mixed -> fp8-mixed: torchao float8 training, emulated")
    refused = open_device("cpu", create_plugin_manager(autoload=False))
    assert check_precision(refused, "fp8-mixed").startswith("refuses fp8-mixed: precision 'fp8-mixed' needs fp8")


def train_lm(precision: str, steps: int, *, options: dict | None = None, resume: object = None,
             save: object = None, device: str = "cpu") -> tuple[list[float], devplug.Trainer, torch.nn.Module]:
    trainer = devplug.Trainer(device=device, precision=precision, device_options=options or {}, seed=0,
                              progress=False)
    losses, model = train_byte_lm(trainer, SPEC, steps, resume=resume, save=save)
    return losses, trainer, model


@pytest.mark.slow  # 200 steps twice, the fp8 ones emulated: about a minute on two loaded cores
def test_the_lm_trains_in_emulated_fp8_to_within_two_percent_of_bf16():
    fp8, trainer, model = train_lm("fp8-mixed", 200, options=EMULATE)
    bf16, _, _ = train_lm("bf16-mixed", 200)
    assert float8_layers(model) == 5  # qkv, projection, two MLP layers, the output head (all dims divisible by 16)
    assert trainer.summary()["precision"] == "fp8-mixed"
    end_fp8, end_bf16 = sum(fp8[-20:]) / 20, sum(bf16[-20:]) / 20
    assert end_fp8 < fp8[0] - 0.5  # it learned
    assert end_fp8 == pytest.approx(end_bf16, rel=0.02)


def test_an_fp8_checkpoint_resumes_in_bf16_and_back(tmp_path):
    _, _, fp8_model = train_lm("fp8-mixed", 3, options=EMULATE, save=tmp_path / "fp8.pt")
    _, _, bf16_model = train_lm("bf16-mixed", 0, resume=tmp_path / "fp8.pt", save=tmp_path / "bf16.pt")
    assert float8_layers(bf16_model) == 0
    for (name, a), (_, b) in zip(fp8_model.state_dict().items(), bf16_model.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    _, _, back = train_lm("fp8-mixed", 0, options=EMULATE, resume=tmp_path / "bf16.pt")
    assert float8_layers(back) == 5
    assert all(torch.equal(a, b) for a, b in zip(back.state_dict().values(), bf16_model.state_dict().values(),
                                                 strict=True))


@pytest.mark.cuda
@pytest.mark.skipif(not (torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)),
                    reason="needs an NVIDIA GPU with fp8 matrix multiplies (compute capability 8.9 or newer)")
def test_gpu_fp8_trains_with_real_fp8_matmuls_within_two_percent_of_bf16_and_resumes_in_bf16(tmp_path):
    # this model's layers are below the sizes where fp8 pays: the device option converts them all the same
    fp8, trainer, model = train_lm("fp8-mixed", 200, device="cuda", options={"fp8_small_layers": True},
                                   save=tmp_path / "fp8.pt")
    bf16, _, _ = train_lm("bf16-mixed", 200, device="cuda")
    assert float8_layers(model) == 5
    assert "emulat" not in trainer.summary()["precision_detail"]
    end_fp8, end_bf16 = sum(fp8[-20:]) / 20, sum(bf16[-20:]) / 20
    assert end_fp8 < fp8[0] - 0.5
    assert end_fp8 == pytest.approx(end_bf16, rel=0.02)
    _, _, resumed = train_lm("bf16-mixed", 0, device="cuda", resume=tmp_path / "fp8.pt")
    assert float8_layers(resumed) == 0
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), resumed.state_dict().values(),
                                                 strict=True))


def test_the_fp8_plan_keeps_the_devices_optimizer_step_context():
    entered: list[str] = []
    params = PrecisionParams(device_type="cpu", convert_module=lambda module: module,
                             optimizer_step_context=lambda: _note(entered))
    plan = precision_named("fp8-mixed").plan(params)
    assert plan.optimizer_step_context is not None
    with plan.optimizer_step_context():
        pass
    assert entered == ["step"]


def _note(entered: list[str]):
    import contextlib

    @contextlib.contextmanager
    def noting():
        entered.append("step")
        yield

    return noting()


def test_the_cpus_emulated_fp8_keeps_the_layers_fp8_skip_names_as_the_gpu_does():
    # the emulated path is there to test a model before its GPU run: the same device options, the same layers
    trainer = devplug.Trainer(device="cpu", precision="fp8-mixed", progress=False,
                              device_options={**EMULATE, "fp8_skip": ["head"]})
    model = torch.nn.Sequential()
    model.add_module("body", torch.nn.Linear(32, 32))
    model.add_module("head", torch.nn.Linear(32, 16))
    model = trainer.setup(model)
    assert type(model.body).__name__ == "Float8Linear" and type(model.head) is torch.nn.Linear
    with pytest.raises(PrecisionError, match="fp8_skip=3"):
        devplug.Trainer(device="cpu", precision="fp8-mixed", progress=False, device_options={**EMULATE, "fp8_skip": 3})


def test_the_cuda_fp8_plan_says_that_uncompiled_fp8_is_slow_and_to_compile():
    device = devplug.Device(spec=cuda_plugin.devplug_register_devices(), index=None, plugin_name="cuda")
    note = plan_fp8(device, (9, 0)).uncompiled_note
    assert "separate kernels" in note and "compile=True" in note
