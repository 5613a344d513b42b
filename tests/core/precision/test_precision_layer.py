"""The precision layer: one module per precision, the names in one registry, plugins parameterising it."""

from __future__ import annotations

import pytest
import torch
import toy_precision
from toys import make_data, make_model

import devplug
from devplug import toolkit
from devplug.core.contract.records import PRECISIONS
from devplug.core.precision import bf16_mixed, fp8_mixed, fp16_mixed, full_32
from devplug.core.registry.manager import create_plugin_manager


@pytest.fixture
def toy():
    """The toy precision, registered the way a new precision is: one registration line."""
    toolkit.register_precision(toy_precision.PRECISION)
    yield toy_precision.PRECISION
    toolkit.unregister_precision(toy_precision.PRECISION.name)


def _one_step(precision: str) -> tuple[devplug.Trainer, list[torch.Tensor]]:
    trainer = devplug.Trainer(device="cpu", precision=precision, progress=False, seed=0)
    model = trainer.setup(make_model())
    opt = trainer.optimizer("adam", model.parameters(), lr=1e-2)
    loader = trainer.dataloader(make_data(8), batch_size=8, num_workers=0)
    for _ in trainer.epochs(1, max_steps=1):
        for x, y in loader:
            with trainer.autocast():
                loss = torch.nn.functional.mse_loss(model(x), y)
            trainer.backward(loss)
            trainer.step(opt)
    return trainer, [p.detach().clone() for p in model.parameters()]


def test_a_new_precision_is_one_module_plus_one_registration_line_and_trains_on_the_cpu(toy):
    trainer, weights = _one_step(toy.name)
    assert trainer.precision.name == "toy-scaled-32"
    assert isinstance(trainer.scaler, torch.amp.GradScaler) and trainer.precision.description.startswith("fp32 with")
    assert trainer.global_step == 1
    assert trainer.scaler.state_dict()["_growth_tracker"] == 1  # the scaler scaled the loss and stepped once
    _, reference = _one_step("32-true")
    # scaling by a power of two and unscaling is exact in fp32: the same weights as plain fp32
    assert all(torch.equal(a, b) for a, b in zip(weights, reference, strict=True))


def test_the_names_live_in_the_registry_and_everything_derives_from_it(toy):
    assert PRECISIONS == ("auto", "32-true", "16-mixed", "bf16-mixed", "fp8-mixed")  # the built-ins, as at import
    assert toolkit.precision_names() == ("32-true", "16-mixed", "bf16-mixed", "fp8-mixed", "toy-scaled-32")
    with pytest.raises(devplug.PrecisionError, match=r"'fp8-magic' is not one of 32-true, 16-mixed, bf16-mixed, "
                                                     r"fp8-mixed, toy-scaled-32, auto$"):
        devplug.Trainer(device="cpu", precision="fp8-magic", progress=False)
    with pytest.raises(devplug.ConfigError, match=r"one of auto, 32-true, 16-mixed, bf16-mixed, fp8-mixed, "
                                                  r"toy-scaled-32"):
        devplug.Trainer(device="cpu", precision=" ", progress=False)


def test_each_built_in_precision_says_its_dtype_and_whether_it_needs_a_scaler_and_why():
    built_in = {p.name: p for p in (full_32.PRECISION, fp16_mixed.PRECISION, bf16_mixed.PRECISION,
                                    fp8_mixed.PRECISION)}
    assert {name: toolkit.precision_named(name) for name in PRECISIONS[1:]} == built_in
    assert [(p.compute_dtype, p.needs_scaler) for p in built_in.values()] == [
        (torch.float32, False), (torch.float16, True), (torch.bfloat16, False), (torch.bfloat16, False)]
    assert all(p.scaler_reason and p.summary for p in built_in.values())


def test_registering_a_taken_name_or_auto_is_refused(toy):
    with pytest.raises(ValueError, match="'toy-scaled-32' is already registered"):
        toolkit.register_precision(toy_precision.ToyScaled32())

    class Auto(toy_precision.ToyScaled32):
        name = "auto"

    with pytest.raises(ValueError, match="other than 'auto'"):
        toolkit.register_precision(Auto())
    with pytest.raises(ValueError, match="devplug Precision"):
        toolkit.register_precision("bf16-mixed")  # type: ignore[arg-type]


def test_dropping_a_scaler_the_precision_needs_takes_a_reason(toy):
    device = devplug.Trainer(device="cpu", precision="32-true", progress=False).device
    with pytest.raises(ValueError, match="'toy-scaled-32' PrecisionPlan has no grad scaler, which that precision"):
        toolkit.precision_plan(device, toy.name, scaler=False)
    with pytest.raises(ValueError, match="'toy-scaled-32' PrecisionPlan has no grad scaler"):  # a plugin's own plan
        devplug.PrecisionPlan(name=toy.name)
    plan = toolkit.precision_plan(device, toy.name, scaler=False, no_scaler_reason="the optimizer scales")
    assert plan.scaler is None and plan.no_scaler_reason == "the optimizer scales"


def test_a_plugin_parameterises_a_precision_rather_than_restating_it():
    device = devplug.Trainer(device="cpu", precision="32-true", progress=False).device
    plan = toolkit.precision_plan(device, "bf16-mixed", notes=["auto: native bf16"])
    context = plan.autocast()
    assert isinstance(context, torch.autocast) and (context.device, context.fast_dtype) == ("cpu", torch.bfloat16)
    assert plan.description == "torch.autocast('cpu', bfloat16) (auto: native bf16)"
    converted = []
    cast_by_conversion = toolkit.precision_plan(device, "bf16-mixed", autocast=False, convert_module=converted.append,
                                                description="the device converts the model")
    assert cast_by_conversion.autocast is devplug.PrecisionPlan("x").autocast  # no autocast entered
    assert cast_by_conversion.convert_module is not None and cast_by_conversion.scaler is None
    assert cast_by_conversion.name == "bf16-mixed" and cast_by_conversion.description == "the device converts the model"


def test_the_cpu_plugin_warns_for_any_precision_computing_in_a_format_it_emulates(monkeypatch, caplog):
    from devplug.plugins.cpu import plugin as cpu_plugin

    class ToyBf16(toy_precision.ToyScaled32):
        name = "toy-bf16"
        compute_dtype = torch.bfloat16

    toolkit.register_precision(ToyBf16())
    try:
        toolkit.forget_logged()
        monkeypatch.setattr(cpu_plugin, "cpu_flags", lambda: frozenset({"avx2", "fma"}))
        with caplog.at_level("WARNING", logger="devplug"):
            device = devplug.Trainer(device="cpu", precision="32-true", progress=False).device
            plan = cpu_plugin.devplug_precision(device=device, precision="toy-bf16")
        assert plan.name == "toy-bf16"
        assert any("no native bf16 arithmetic" in r.getMessage() for r in caplog.records)
    finally:
        toolkit.unregister_precision("toy-bf16")
        toolkit.forget_logged()


def test_a_plugin_may_still_return_its_own_plan_for_a_registered_name(toy):
    class OwnPlan:
        @devplug.hookimpl
        def devplug_precision(self, device, precision):
            return devplug.PrecisionPlan(name=precision, scaler=torch.amp.GradScaler("cpu"), description="mine")

    pm = create_plugin_manager(autoload=False, extra_plugins=[("own-plan", OwnPlan())])
    trainer = devplug.Trainer(device="cpu", precision=toy.name, progress=False, plugin_manager=pm)
    assert trainer.precision.description == "mine"


def test_the_kit_checks_a_registered_precision_and_its_scaler_on_the_cpu(toy):
    from devplug.testing import open_device
    from devplug.testing.checks.precision import check_precision
    from devplug.testing.checks.sharding import check_sharding

    dut = open_device("cpu", create_plugin_manager(autoload=False))
    assert check_precision(dut, toy.name).startswith("toy-scaled-32 -> toy-scaled-32: fp32 with a grad scaler")
    assert check_sharding(dut, toy.name).startswith("toy-scaled-32: gather fp32, reduce fp32")  # fp32 compute


def _device(name: str) -> devplug.Device:
    """A Device record as the registry builds it for a built-in plugin's device type (no hardware needed)."""
    spec = devplug.DeviceSpec(name=name, description=name, priority=100, probe=devplug.Availability.yes)
    return devplug.Device(spec=spec, index=None, plugin_name=name)


def test_gaudi_plans_a_registered_precision_through_the_layer_and_refuses_one_computing_in_fp16(toy):
    from devplug.plugins.hpu import precision as hpu_precision

    plan = hpu_precision.plan_precision(_device("hpu"), toy.name)
    assert plan.name == toy.name and isinstance(plan.scaler, torch.amp.GradScaler)

    class ToyFp16(toy_precision.ToyScaled32):
        name = "toy-fp16"
        compute_dtype = torch.float16

    toolkit.register_precision(ToyFp16())
    try:
        with pytest.raises(devplug.PrecisionError, match="GPU recipe"):
            hpu_precision.plan_precision(_device("hpu"), "toy-fp16")
        with pytest.raises(devplug.PrecisionError, match=r"'fp8' is not one of auto, 32-true, bf16-mixed, "
                                                         r"fp8-mixed, toy-scaled-32, hmp \(the settings Gaudi runs\)"):
            hpu_precision.plan_precision(_device("hpu"), "fp8")
    finally:
        toolkit.unregister_precision("toy-fp16")


@pytest.mark.filterwarnings("ignore:torch.cuda.amp.GradScaler is enabled, but CUDA is not available")
def test_cuda_adds_what_it_knows_of_the_gpu_to_a_registered_precisions_plan(toy):
    from devplug.plugins.cuda import precision as cuda_precision

    plan = cuda_precision.plan_precision(_device("cuda"), toy.name)
    assert plan.name == toy.name and isinstance(plan.scaler, torch.amp.GradScaler)
    assert plan.description == "fp32 with a grad scaler (a toy) (TF32 matmul/cuDNN on Ampere and newer)"


def test_a_plugin_plan_without_the_scaler_a_registered_precision_needs_is_refused_naming_the_plugin(toy):
    class NoScaler:
        @devplug.hookimpl(tryfirst=True)
        def devplug_precision(self, device, precision):
            return devplug.PrecisionPlan(name=precision)

    pm = create_plugin_manager(autoload=False, extra_plugins=[("no-scaler", NoScaler())])
    with pytest.raises(devplug.PluginError) as caught:
        devplug.Trainer(device="cpu", precision=toy.name, progress=False, plugin_manager=pm)
    assert str(caught.value).startswith("devplug_precision of plugin 'no-scaler' (registered at run time) raised "
                                        "ValueError: a 'toy-scaled-32' PrecisionPlan has no grad scaler, which that "
                                        "precision needs (it stands for a format whose gradients underflow")


def test_the_core_checks_a_plugins_plan_against_the_registered_precisions_autocast_dtype():
    toy_bf16 = toolkit.AutocastPrecision(name="toy-autocast-bf16", compute_dtype=torch.bfloat16, needs_scaler=False,
                                         scaler_reason="bfloat16 keeps fp32's range", summary="a toy")

    class CastsFp16:
        @devplug.hookimpl(tryfirst=True)
        def devplug_precision(self, device, precision):
            return devplug.PrecisionPlan(name=precision, autocast=lambda: torch.autocast("cpu", dtype=torch.float16))

    toolkit.register_precision(toy_bf16)
    try:
        assert toy_bf16.autocast_dtype == torch.bfloat16 and toy_precision.PRECISION.autocast_dtype is None
        pm = create_plugin_manager(autoload=False, extra_plugins=[("casts-fp16", CastsFp16())])
        with pytest.raises(devplug.PluginError, match=r"'toy-autocast-bf16' plan whose autocast casts to float16 on "
                                                      r"'cpu'; a 'toy-autocast-bf16' plan casts to bfloat16"):
            devplug.Trainer(device="cpu", precision=toy_bf16.name, progress=False, plugin_manager=pm)
        plan = devplug.Trainer(device="cpu", precision=toy_bf16.name, progress=False).precision
        assert plan.description == "torch.autocast('cpu', bfloat16)"  # the CPU plugin planned it through the layer
    finally:
        toolkit.unregister_precision(toy_bf16.name)
