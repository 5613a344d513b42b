"""Optimizer state moves between implementations and devices: save with one, resume with another.

A matrix over torch's for-loop, foreach and fused optimizers, NVIDIA apex's FusedAdam/FusedSGD and Intel
Gaudi's FusedAdamW/FusedSGD (the stand-ins in tests/standins mirror their state layouts): train k steps
with A, save through a Trainer, load with B, train k more; the weights match an uninterrupted run of A
(bitwise when A is B). Then whole Trainers: CPU to the template plugin's ``cpusim``, CPU to Gaudi and back.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from paths import REPO, STANDINS
from standins import hpu_fixtures

import devplug
from devplug.core.errors import CheckpointError
from devplug.core.registry.manager import create_plugin_manager
from devplug.plugins.cuda import optimizers as cuda_optimizers
from devplug.plugins.hpu import optimizers as hpu_optimizers
from devplug.toolkit import torch_optimizer_class

TEMPLATE_SRC = REPO / "examples" / "template_plugin" / "src"
K = 3
OPTIONS: dict[str, dict[str, Any]] = {
    "adam": {"lr": 1e-2, "betas": (0.8, 0.99)},
    "adamw": {"lr": 1e-2, "weight_decay": 0.1},
    "sgd": {"lr": 0.05, "momentum": 0.9},
}
Builder = Callable[[Any, str, list[Any], dict[str, Any]], devplug.OptimizerChoice]


def _torch(kernel: dict[str, bool]) -> Builder:
    def build(device: Any, name: str, params: list[Any], options: dict[str, Any]) -> devplug.OptimizerChoice:
        cls = torch_optimizer_class(name)
        return devplug.OptimizerChoice(cls(params, **kernel, **options), f"torch.optim.{cls.__name__}({kernel})")
    return build


def _apex(device: Any, name: str, params: list[Any], options: dict[str, Any]) -> devplug.OptimizerChoice:
    import apex.optimizers

    choice = cuda_optimizers.build_apex(name, params, options, cuda_optimizers.ApexStatus(optimizers=apex.optimizers))
    assert isinstance(choice, devplug.OptimizerChoice) and choice.implementation.startswith("apex."), choice
    return choice


def _habana(device: Any, name: str, params: list[Any], options: dict[str, Any]) -> devplug.OptimizerChoice:
    choice = hpu_optimizers.build_optimizer(device, name, params, options)
    assert choice is not None and choice.implementation.startswith("habana_frameworks"), choice
    return choice


IMPLEMENTATIONS: dict[str, Builder] = {
    "for-loop": _torch({"foreach": False}), "foreach": _torch({"foreach": True}), "fused": _torch({"fused": True}),
    "apex": _apex, "habana": _habana,
}


class Pick:
    """A device-neutral plugin that builds every optimizer with one implementation."""

    DEVPLUG_CONTRACT = "1.1"

    def __init__(self, build: Builder) -> None:
        self.build = build

    @devplug.hookimpl(tryfirst=True)
    def devplug_optimizer(self, device: Any, name: str, params: Any, options: dict[str, Any]) -> Any:
        """The chosen implementation of ``name``."""
        return self.build(device, name, list(params), options)


@pytest.fixture
def vendors(monkeypatch: pytest.MonkeyPatch):
    """The apex and Gaudi stand-ins importable for one test."""
    for name in [m for m in sys.modules if m == "apex" or m.startswith("apex.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.syspath_prepend(str(STANDINS / "apex_standin"))
    yield from hpu_fixtures.standin(monkeypatch)
    for name in [m for m in sys.modules if m == "apex" or m.startswith("apex.")]:
        del sys.modules[name]


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    return torch.randn(2 * K, 8, 4, generator=g), torch.randn(2 * K, 8, 1, generator=g)


def _trainer(build: Builder, algorithm: str, seed: int = 0) -> tuple[devplug.Trainer, torch.nn.Module, Any]:
    pm = create_plugin_manager(autoload=False, extra_plugins=[("pick", Pick(build))])
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False, plugin_manager=pm)
    torch.manual_seed(seed)
    model = trainer.setup(torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Tanh(), torch.nn.Linear(6, 1)), "net")
    return trainer, model, trainer.optimizer(algorithm, model.parameters(), **OPTIONS.get(algorithm, {"lr": 1e-2}))


def _train(trainer: devplug.Trainer, model: torch.nn.Module, opt: Any, steps: range) -> None:
    xs, ys = _data()
    for i in steps:
        trainer.backward(torch.nn.functional.mse_loss(model(xs[i]), ys[i]))
        trainer.step(opt)


@pytest.mark.usefixtures("vendors")
@pytest.mark.parametrize("algorithm", ["adam", "adamw", "sgd"])
def test_state_saved_by_any_implementation_resumes_on_any_other(tmp_path, algorithm):
    for a, build_a in IMPLEMENTATIONS.items():
        full, full_model, full_opt = _trainer(build_a, algorithm)
        _train(full, full_model, full_opt, range(2 * K))
        first, model, opt = _trainer(build_a, algorithm)
        _train(first, model, opt, range(K))
        path = first.save(tmp_path / f"{a}.pt")
        for b, build_b in IMPLEMENTATIONS.items():
            resumed, resumed_model, resumed_opt = _trainer(build_b, algorithm, seed=1)
            resumed.load(path)
            _train(resumed, resumed_model, resumed_opt, range(K, 2 * K))
            for name, want in full_model.state_dict().items():
                got = resumed_model.state_dict()[name]
                if a == b:
                    assert torch.equal(got, want), f"{algorithm}: {a} -> {b}: {name} differs from the uninterrupted run"
                else:
                    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6,
                                               msg=lambda m, a=a, b=b: f"{algorithm}: {a} -> {b}: {m}")


@pytest.mark.usefixtures("vendors")
def test_canonical_state_is_torchs_layout_whoever_wrote_it(tmp_path):
    for name, build in IMPLEMENTATIONS.items():
        trainer, model, opt = _trainer(build, "adamw")
        _train(trainer, model, opt, range(K))
        entry = torch.load(trainer.save(tmp_path / f"{name}.pt"), weights_only=True)["optimizers"]["net"]
        assert entry["layout"] == "canonical" and entry["algorithm"] == "adamw"
        assert entry["implementation"] == trainer.optimizer_implementation(opt)
        state = entry["state"]
        assert {tuple(sorted(s)) for s in state["state"].values()} == {("exp_avg", "exp_avg_sq", "step")}, name
        assert all(torch.equal(s["step"], torch.tensor(float(K))) for s in state["state"].values()), name
        [group] = state["param_groups"]
        assert group["decoupled_weight_decay"] is True and group["weight_decay"] == 0.1 and group["amsgrad"] is False
        assert not {"foreach", "fused", "bias_correction", "step"} & set(group), name


def _lamb(device: Any, name: str, params: list[Any], options: dict[str, Any]) -> devplug.OptimizerChoice:
    import apex.optimizers

    built = cuda_optimizers.build_apex("lamb", params, options, cuda_optimizers.ApexStatus(optimizers=apex.optimizers))
    assert isinstance(built, devplug.OptimizerChoice)
    return built


@pytest.mark.usefixtures("vendors")
def test_lamb_has_no_canonical_form_and_moves_only_to_lamb(tmp_path):
    trainer, model, opt = _trainer(_lamb, "lamb")
    _train(trainer, model, opt, range(K))
    path = trainer.save(tmp_path / "lamb.pt")
    assert torch.load(path, weights_only=True)["optimizers"]["net"]["layout"] == "native"
    same, same_model, _ = _trainer(_lamb, "lamb", seed=1)
    same.load(path)
    assert torch.equal(same_model[0].weight, model[0].weight)
    other, other_model, _ = _trainer(_torch({}), "adamw", seed=1)
    before = {k: v.clone() for k, v in other_model.state_dict().items()}
    with pytest.raises(CheckpointError) as caught:
        other.load(path)
    message = str(caught.value)
    assert "optimizer 'net' is lamb in the checkpoint, adamw here" in message and "\n" not in message
    assert all(torch.equal(before[k], v) for k, v in other_model.state_dict().items())


@pytest.mark.usefixtures("vendors")
def test_lamb_state_into_another_lamb_implementation_says_what_to_do(tmp_path):
    def other_lamb(device: Any, name: str, params: list[Any], options: dict[str, Any]) -> devplug.OptimizerChoice:
        choice = _lamb(device, name, params, options)
        return devplug.OptimizerChoice(choice.optimizer, "vendor.FusedLAMB")

    trainer, model, opt = _trainer(_lamb, "lamb")
    _train(trainer, model, opt, range(K))
    path = trainer.save(tmp_path / "lamb.pt")
    other, _, other_opt = _trainer(other_lamb, "lamb", seed=1)
    with pytest.raises(CheckpointError) as caught:
        other.load(path)
    message = str(caught.value)
    assert message.startswith("optimizer 'net': the checkpoint holds apex.optimizers.FusedLAMB's own state")
    assert "lamb has no torch.optim counterpart" in message and "this run built vendor.FusedLAMB" in message
    assert "resume where apex.optimizers.FusedLAMB is used" in message and "\n" not in message
    assert other_opt.state_dict()["state"] == {}


@pytest.mark.usefixtures("vendors")
@pytest.mark.parametrize("target", ["apex", "habana"])
def test_params_at_different_steps_cannot_go_into_a_per_group_step_optimizer(tmp_path, target):
    trainer, model, opt = _trainer(IMPLEMENTATIONS["foreach"], "adam")
    _train(trainer, model, opt, range(K))
    model[2].bias.requires_grad_(False)  # one more step without the last bias: its step count falls behind
    _train(trainer, model, opt, range(K, K + 1))
    model[2].bias.requires_grad_(True)
    path = trainer.save(tmp_path / "ck.pt")
    other, other_model, other_opt = _trainer(IMPLEMENTATIONS[target], "adam", seed=1)
    before = {k: v.clone() for k, v in other_model.state_dict().items()}
    with pytest.raises(CheckpointError) as caught:
        other.load(path)
    message = str(caught.value)
    assert message.startswith(f"optimizer 'net': the adam state written by torch.optim.Adam({{'foreach': True}}) "
                              f"cannot go into {other.optimizer_implementation(other_opt)}: ")
    assert "at different step counts (3, 4)" in message and "resume with torch.optim.Adam" in message
    assert "\n" not in message
    assert all(torch.equal(before[k], v) for k, v in other_model.state_dict().items())
    assert other_opt.state_dict()["state"] == {}
    _trainer(IMPLEMENTATIONS["for-loop"], "adam", seed=1)[0].load(path)  # a torch optimizer takes it


# ---- states that break their algorithm -------------------------------------------------------------------

def _swap_moments(state: Any) -> dict[str, Any]:
    """A converter's bug: Adam's first and second moments in each other's place."""
    swapped = {i: {**s, "exp_avg": s["exp_avg_sq"], "exp_avg_sq": s["exp_avg"]} for i, s in state["state"].items()}
    return {"state": swapped, "param_groups": [dict(g) for g in state["param_groups"]]}


def _swapping(device: Any, name: str, params: list[Any], options: dict[str, Any]) -> devplug.OptimizerChoice:
    return devplug.OptimizerChoice(torch.optim.Adam(params, **options), "vendor.SwappingAdam",
                                   to_canonical=lambda o, s: _swap_moments(s),
                                   from_canonical=lambda o, s: _swap_moments(s))


def test_a_converter_that_swaps_adams_moments_is_refused_on_resume_naming_it(tmp_path):
    trainer, model, opt = _trainer(_torch({}), "adam")
    _train(trainer, model, opt, range(K))
    path = trainer.save(tmp_path / "ck.pt")
    other, other_model, other_opt = _trainer(_swapping, "adam", seed=1)
    before = {k: v.clone() for k, v in other_model.state_dict().items()}
    with pytest.raises(CheckpointError) as caught:
        other.load(path)
    message = str(caught.value)
    assert message.startswith(f"checkpoint {str(path)!r} cannot be restored, and nothing was changed: optimizer "
                              "'net': the adam state that vendor.SwappingAdam's from_canonical of plugin 'pick' "
                              "(registered at run time) made of a valid one is impossible: parameter 0: exp_avg_sq has "
                              "negative values"), message
    assert "\n" not in message
    assert other_opt.state_dict()["state"] == {}
    assert all(torch.equal(before[k], v) for k, v in other_model.state_dict().items())


def test_a_converter_that_swaps_adams_moments_writes_no_checkpoint(tmp_path):
    trainer, model, opt = _trainer(_swapping, "adam")
    _train(trainer, model, opt, range(K))
    with pytest.raises(CheckpointError) as caught:
        trainer.save(tmp_path / "ck.pt")
    message = str(caught.value)
    assert "optimizer 'net': the adam state from vendor.SwappingAdam's to_canonical of plugin 'pick' (registered at " \
           "run time) is impossible: parameter 0: exp_avg_sq has negative values" in message, message
    assert message.startswith("not saving checkpoint") and "\n" not in message
    assert list(tmp_path.iterdir()) == []


# ---- torch.optim subclasses -------------------------------------------------------------------------------

class RenamedAdam(torch.optim.Adam):
    """A vendor's name on torch's Adam: its step and state are torch's."""


class CountingAdam(torch.optim.Adam):
    """An Adam that keeps an entry of its own in each parameter's state: not torch's layout."""

    def step(self, closure: Any = None) -> Any:
        loss = super().step(closure)
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is not None:
                    self.state[param]["vendor_count"] = torch.tensor(float(self.state[param]["step"]))
        return loss


def _subclass(cls: type[torch.optim.Optimizer]) -> Builder:
    def build(device: Any, name: str, params: list[Any], options: dict[str, Any]) -> devplug.OptimizerChoice:
        return devplug.OptimizerChoice(cls(params, **options), f"vendor.{cls.__name__}")
    return build


@pytest.mark.parametrize(("a", "b"), [("subclass", "torch"), ("torch", "subclass")])
def test_a_torch_subclass_that_keeps_torchs_layout_moves_without_converters(tmp_path, a, b):
    builds = {"subclass": _subclass(RenamedAdam), "torch": _torch({"foreach": False})}
    full, full_model, full_opt = _trainer(builds[a], "adam")
    _train(full, full_model, full_opt, range(2 * K))
    first, model, opt = _trainer(builds[a], "adam")
    _train(first, model, opt, range(K))
    path = first.save(tmp_path / "ck.pt")
    assert torch.load(path, weights_only=True)["optimizers"]["net"]["layout"] == "canonical"
    resumed, resumed_model, resumed_opt = _trainer(builds[b], "adam", seed=1)
    resumed.load(path)
    _train(resumed, resumed_model, resumed_opt, range(K, 2 * K))
    for name, want in full_model.state_dict().items():
        torch.testing.assert_close(resumed_model.state_dict()[name], want, rtol=1e-5, atol=1e-7)


def test_a_torch_subclass_with_state_of_its_own_is_saved_in_its_own_layout_saying_why(tmp_path):
    trainer, model, opt = _trainer(_subclass(CountingAdam), "adam")
    _train(trainer, model, opt, range(K))
    entry = torch.load(trainer.save(tmp_path / "ck.pt"), weights_only=True)["optimizers"]["net"]
    assert entry["layout"] == "native"
    assert entry["reason"] == ("vendor.CountingAdam gives no converter to torch.optim's layout, and its state differs "
                               "from torch.optim.Adam's: parameter 0 has ['exp_avg', 'exp_avg_sq', 'step', "
                               "'vendor_count'], torch.optim.Adam has ['exp_avg', 'exp_avg_sq', 'step']")


# ---- whole Trainers across devices -----------------------------------------------------------------------
def _loop_trainer(device: str, pm: Any, seed: int = 0) -> tuple[devplug.Trainer, torch.nn.Module, Any]:
    trainer = devplug.Trainer(device=device, precision="32-true", progress=False, plugin_manager=pm, seed=seed)
    torch.manual_seed(seed)
    model = trainer.setup(torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Tanh(), torch.nn.Linear(6, 1)), "net")
    return trainer, model, trainer.optimizer("adamw", model.parameters(), lr=1e-2, weight_decay=0.05)


def _train_on(trainer: devplug.Trainer, model: torch.nn.Module, opt: Any, steps: range) -> None:
    xs, ys = _data()
    for i in steps:
        x, y = trainer.to_device((xs[i], ys[i]))
        trainer.backward(torch.nn.functional.mse_loss(model(x), y))
        trainer.step(opt)


def _resume_matches(tmp_path: Path, source: tuple[str, Any], target: tuple[str, Any], implementations: tuple[str, str]):
    full = _loop_trainer(*source)
    _train_on(*full, range(2 * K))
    first = _loop_trainer(*source)
    _train_on(*first, range(K))
    assert first[0].optimizer_implementation(first[2]).startswith(implementations[0])
    path = first[0].save(tmp_path / "ck.pt")
    resumed = _loop_trainer(*target, seed=1)
    assert resumed[0].optimizer_implementation(resumed[2]).startswith(implementations[1])
    resumed[0].load(path)
    _train_on(*resumed, range(K, 2 * K))
    for name, want in full[1].state_dict().items():
        torch.testing.assert_close(resumed[1].state_dict()[name].cpu(), want.cpu(), rtol=1e-4, atol=1e-6)


def test_saved_on_cpu_resumes_on_the_template_plugins_cpusim(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(TEMPLATE_SRC))
    from devplug_template_device import device as cpusim

    pm = create_plugin_manager(autoload=False, extra_plugins=[("cpusim", cpusim)])
    try:
        implementations = ("torch.optim.AdamW(fused=True)", "torch.optim.AdamW(foreach=True)")
        _resume_matches(tmp_path, ("cpu", pm), ("cpusim", pm), implementations)
    finally:
        for name in [m for m in sys.modules if m.startswith("devplug_template_device")]:
            del sys.modules[name]


@pytest.fixture
def hpu(monkeypatch: pytest.MonkeyPatch):
    """The Gaudi stand-in for one test."""
    yield from hpu_fixtures.standin(monkeypatch)


@pytest.mark.parametrize("direction", ["cpu to hpu", "hpu to cpu"])
def test_saved_on_cpu_resumes_on_gaudi_and_back(tmp_path, hpu, direction):
    pm = hpu.plugin_manager()
    cpu, gaudi = ("cpu", pm), ("hpu", pm)
    torch_impl, hpex_impl = "torch.optim.AdamW(fused=True)", "habana_frameworks.torch.hpex.optimizers.FusedAdamW"
    if direction == "cpu to hpu":
        _resume_matches(tmp_path, cpu, gaudi, (torch_impl, hpex_impl))
    else:
        _resume_matches(tmp_path, gaudi, cpu, (hpex_impl, torch_impl))
