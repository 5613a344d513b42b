"""fp8-mixed on Gaudi through the stand-in of Intel's Gaudi Transformer Engine: the LM trains with its linear layers
swapped for ``te.Linear`` as the filter says, ``te.fp8_autocast`` is entered around every forward, checkpoints keep
the canonical layout (fp8 to bf16 and back), and Gaudi 1 or a release without TE is refused in one line."""

from __future__ import annotations

import logging

import pytest
import torch
from standins import hpu_fixtures
from toys import train_byte_lm

import devplug
from devplug.core.registry.manager import create_plugin_manager
from devplug.plugins.hpu import fp8
from devplug.testing import ConformanceError, open_device
from devplug.testing.checks.precision import check_precision
from devplug.toolkit import forget_logged

from lm.models import LanguageModel, ModelSpec  # examples/lm

pytestmark = pytest.mark.filterwarnings("ignore:'pin_memory' argument is set as true:UserWarning")

TE = "habana_frameworks.torch.hpex.experimental.transformer_engine"
SPEC = ModelSpec(width=32, layers=1, heads=2, context=16)
SMALL = {"fp8_small_layers": True}  # the tiny LM's layers are far below the sizes where fp8 pays


@pytest.fixture
def hpu(monkeypatch: pytest.MonkeyPatch):
    """The stand-in Gaudi stack (a Gaudi 2), lazy mode, one device."""
    yield from hpu_fixtures.standin(monkeypatch)


def te_layers(module: torch.nn.Module) -> list[str]:
    return [name for name, m in module.named_modules() if type(m).__name__ == "Linear" and TE in type(m).__module__]


def train(hpu, precision: str, steps: int, *, options: dict | None = None, resume=None, save=None):
    trainer = devplug.Trainer(device="hpu", precision=precision, device_options=options or {}, seed=0, progress=False,
                              plugin_manager=hpu.plugin_manager())
    hpu.reset()  # the calls of the loop alone (devplug enters a plan's autocast once to check its dtype)
    losses, model = train_byte_lm(trainer, SPEC, steps, resume=resume, save=save)
    return losses, trainer, model


def test_the_lm_trains_in_fp8_through_intels_transformer_engine(hpu):
    bf16, _, _ = train(hpu, "bf16-mixed", 30)
    losses, trainer, model = train(hpu, "fp8-mixed", 30, options=SMALL)  # the call log now holds this run alone
    # qkv, projection and the two MLP layers; the output head (the last linear layer) stays in bf16
    assert te_layers(model) == ["blocks.0.qkv", "blocks.0.projection", "blocks.0.mlp.0", "blocks.0.mlp.2"]
    assert type(model.head) is torch.nn.Linear
    assert trainer.precision.name == "fp8-mixed" and "te.fp8_autocast" in trainer.precision.description
    assert sum(losses[-5:]) / 5 < losses[0] - 0.5  # it learned, as bf16 does, yet not with bf16's numbers
    assert losses != bf16 and sum(losses[-5:]) / 5 == pytest.approx(sum(bf16[-5:]) / 5, rel=0.02)
    # the autocast was entered once per step, enabled, with one recipe: HYBRID and Intel's defaults
    entered = hpu.details("te.fp8_autocast.enter")
    assert len(entered) == 30 and all(call["enabled"] for call in entered)
    recipe = entered[0]["recipe"]
    assert all(call["recipe"] is recipe for call in entered)
    assert (recipe.fp8_format.name, recipe.margin, recipe.interval, recipe.amax_history_len,
            recipe.amax_compute_algo) == ("HYBRID", 0, 1, 1, "most_recent")
    # every swapped layer ran in fp8 every step, and its scales moved off 1 after the first amax
    assert hpu.count("te.Linear.fp8_forward") == 4 * 30
    assert torch.all(model.blocks[0].qkv.fp8_meta["scaling_fwd"].scale != 1.0)


def test_the_swap_keeps_the_parameters_so_the_optimizer_and_names_are_untouched(hpu):
    model = LanguageModel(SPEC)
    before = dict(model.named_parameters())
    plan = devplug.Trainer(device="hpu", precision="fp8-mixed", device_options=SMALL, progress=False,
                           plugin_manager=hpu.plugin_manager()).precision
    converted = plan.convert_module(model)
    after = dict(converted.named_parameters())
    assert list(after) == list(before) and all(after[name] is before[name] for name in before)
    assert list(converted.state_dict()) == list(LanguageModel(SPEC).state_dict())  # no _extra_state entries
    assert all(call["skip_weight_param_allocation"] for call in hpu.details("te.Linear"))


def test_the_filter_keeps_layers_fp8_does_not_pay_for_and_the_head_in_bf16(hpu):
    with torch.device("meta"):
        model = torch.nn.Sequential()
        model.add_module("up", torch.nn.Linear(4096, 4096))  # big enough: swapped
        model.add_module("small", torch.nn.Linear(4096, 1024))  # below the sizes where fp8 pays
        model.add_module("odd", torch.nn.Linear(4096, 4100))  # not divisible by 16
        model.add_module("named", torch.nn.Linear(4096, 4096))  # skipped by name
        model.add_module("head", torch.nn.Linear(4096, 8192))  # the last linear layer: the output head
    choose = fp8.layer_filter(small_layers=False, head=False, skip=("named",))
    fp8.swap_linears(model, _te(), choose(model))
    assert te_layers(model) == ["up"]
    with_head = fp8.layer_filter(small_layers=True, head=True, skip=())
    assert fp8.swap_linears(model, _te(), with_head(model)) == ["small", "named", "head"]  # "odd" never


def _te():
    import importlib

    return importlib.import_module(TE)


def test_an_fp8_checkpoint_resumes_in_bf16_and_back(hpu, tmp_path):
    _, _, fp8_model = train(hpu, "fp8-mixed", 3, options=SMALL, save=tmp_path / "fp8.pt")
    saved = torch.load(tmp_path / "fp8.pt", weights_only=True)["modules"]["lm"]
    assert not [key for key in saved if key.endswith("_extra_state")]  # the canonical layout, no pickled meta
    _, _, bf16_model = train(hpu, "bf16-mixed", 0, resume=tmp_path / "fp8.pt", save=tmp_path / "bf16.pt")
    assert te_layers(bf16_model) == []
    for (name, a), (_, b) in zip(fp8_model.state_dict().items(), bf16_model.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    losses, _, back = train(hpu, "fp8-mixed", 2, options=SMALL, resume=tmp_path / "bf16.pt")
    assert len(te_layers(back)) == 4 and all(torch.isfinite(torch.tensor(losses)))
    assert back.blocks[0].qkv.weight.data_ptr() != bf16_model.blocks[0].qkv.weight.data_ptr()


@pytest.mark.parametrize("lazy", [True, False], ids=["lazy", "eager"])
def test_lazy_mode_marks_steps_as_in_bf16_and_eager_mode_not_at_all(monkeypatch, lazy):
    for stack in hpu_fixtures.standin(monkeypatch, lazy=lazy):
        train(stack, "fp8-mixed", 3, options=SMALL)
        # lazy: after each backward and each optimizer step, as in bf16; eager: never
        assert stack.count("mark_step") == (6 if lazy else 0)
        assert stack.count("te.fp8_autocast.enter") == 3 and stack.count("te.Linear.fp8_forward") == 12


def test_gaudi_1_refuses_fp8_in_one_line_naming_the_hardware_that_has_it(hpu, monkeypatch):
    monkeypatch.setenv("HPU_STANDIN_DEVICE_TYPE", "gaudi")
    with pytest.raises(devplug.PrecisionError) as caught:
        devplug.Trainer(device="hpu", precision="fp8-mixed", progress=False, plugin_manager=hpu.plugin_manager())
    message = str(caught.value)
    assert "\n" not in message and "first-generation Gaudi" in message
    assert "Gaudi 2 and Gaudi 3" in message and "H100" in message


def test_a_gaudi_release_without_the_transformer_engine_is_refused_in_one_line(hpu):
    hpu.remove(TE)
    with pytest.raises(devplug.PrecisionError) as caught:
        devplug.Trainer(device="hpu", precision="fp8-mixed", progress=False, plugin_manager=hpu.plugin_manager())
    message = str(caught.value)
    assert "\n" not in message and "Intel Gaudi Transformer Engine" in message and "bf16-mixed" in message


@pytest.mark.parametrize(("recipe", "says"), [
    ({"fp8_format": "e4m3"}, "Only E5M2 and HYBRID training are currently supported"),  # the vendor's assertion
    ({"fp8_format": "e6m1"}, "not a Gaudi fp8 format"),
    ({"history": 4}, "unknown fp8_recipe field"),
    ("hybrid", "give a mapping"),
])
def test_a_recipe_intel_refuses_is_one_line(hpu, recipe, says):
    with pytest.raises(devplug.PrecisionError, match=says) as caught:
        devplug.Trainer(device="hpu", precision="fp8-mixed", device_options={"fp8_recipe": recipe}, progress=False,
                        plugin_manager=hpu.plugin_manager())
    assert "\n" not in str(caught.value)


def test_a_recipe_option_reaches_the_transformer_engine(hpu):
    options = {**SMALL, "fp8_recipe": {"fp8_format": "e5m2", "amax_history_len": 4, "amax_compute_algo": "max",
                                       "interval": 2}}
    _, _, model = train(hpu, "fp8-mixed", 3, options=options)
    recipe = hpu.details("te.fp8_autocast.enter")[0]["recipe"]
    assert (recipe.fp8_format.name, recipe.amax_history_len, recipe.amax_compute_algo, recipe.interval) == (
        "E5M2", 4, "max", 2)
    assert model.blocks[0].qkv.fp8_meta["scaling_fwd"].amax_history.shape == (4, 2)


def test_the_kit_checks_the_gaudi_fp8_answer_and_the_gaudi_1_refusal(hpu, monkeypatch):
    dut = open_device("hpu", create_plugin_manager(autoload=False))
    assert check_precision(dut, "fp8-mixed").startswith("fp8-mixed -> fp8-mixed: Intel Gaudi Transformer Engine")
    monkeypatch.setenv("HPU_STANDIN_DEVICE_TYPE", "gaudi")
    refused = open_device("hpu", create_plugin_manager(autoload=False))
    assert check_precision(refused, "fp8-mixed").startswith("refuses fp8-mixed: precision 'fp8-mixed' needs fp8")


def test_the_kit_refuses_an_fp8_answer_that_saves_the_engines_scaling_state(hpu, monkeypatch):
    monkeypatch.setattr(fp8, "_drop_extra_state", lambda *args: None)  # te.Linear's _extra_state left in
    dut = open_device("hpu", create_plugin_manager(autoload=False))
    with pytest.raises(ConformanceError, match=r"adds 0\._extra_state to the model's state_dict\(\)"):
        check_precision(dut, "fp8-mixed")


def test_a_model_too_small_for_fp8_to_pay_is_told_it_trains_in_bf16(hpu, caplog):
    forget_logged()
    with caplog.at_level(logging.INFO, logger="devplug"):
        _, _, model = train(hpu, "fp8-mixed", 1)
    assert te_layers(model) == []
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "fp8" in r.getMessage()]
    assert len(warned) == 1 and "none of the 5 linear layer(s) of LanguageModel" in warned[0]
    assert "fp8_small_layers" in warned[0]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="devplug"):
        train(hpu, "fp8-mixed", 1, options=SMALL)
    assert "4 of the 5 linear layer(s) of LanguageModel run in fp8 (te.Linear)" in caplog.text


def test_fp8_skip_given_as_one_name_skips_that_layer_not_every_layer_with_one_of_its_letters(hpu):
    spec = devplug.DeviceSpec(name="hpu", description="Gaudi", priority=100, probe=devplug.Availability.yes)
    device = devplug.Device(spec=spec, index=None, plugin_name="hpu", options={"fp8_skip": "named"})
    plan = fp8.plan_fp8(device)
    with torch.device("meta"):
        model = torch.nn.Sequential()
        model.add_module("encoder", torch.nn.Linear(4096, 4096))
        model.add_module("named", torch.nn.Linear(4096, 4096))
        model.add_module("head", torch.nn.Linear(4096, 8192))
    plan.convert_module(model)
    assert te_layers(model) == ["encoder"]
