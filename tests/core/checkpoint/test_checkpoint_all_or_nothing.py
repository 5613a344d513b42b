"""A load restores everything or nothing: the objects registered for checkpointing take part in the same restore
as the modules and optimizers, so one whose ``load_state_dict`` refuses the saved state leaves the whole
Trainer as it was (weights, optimizer, position, other registered objects), with one CheckpointError line."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import TensorDataset

import devplug
from devplug.core.errors import CheckpointError


class Picky:
    """A user object registered for checkpointing; it reads only the states of its own version."""

    def __init__(self) -> None:
        self.value, self.version = 0, 1

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value, "version": self.version}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value = state["value"]  # half-loaded when it then refuses
        if state["version"] != self.version:
            raise ValueError("this version cannot read that state")


def make_model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))


def build(seed: int) -> tuple[devplug.Trainer, torch.nn.Module, torch.optim.Optimizer, dict[str, Any]]:
    t = devplug.Trainer(device="cpu", precision="32-true", progress=False, seed=seed)
    model = t.setup(make_model(), name="net")
    opt = t.optimizer("adam", model.parameters(), lr=1e-2)
    own = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    objects = {"noise": torch.full((2, 3), float(seed)), "sched": sched, "own": own, "picky": Picky()}
    t.register_for_checkpointing(**objects)
    return t, model, opt, objects


def train(t: devplug.Trainer, model: torch.nn.Module, opt: torch.optim.Optimizer, objects: dict[str, Any]) -> None:
    g = torch.Generator().manual_seed(3)
    data = TensorDataset(torch.randn(24, 5, generator=g), torch.randn(24, 1, generator=g))
    for _ in t.epochs(1, max_steps=3):
        for x, y in t.dataloader(data, batch_size=4, num_workers=0):
            t.backward(torch.nn.functional.mse_loss(model(x), y))
            t.step(opt)
            objects["own"].step()
            objects["sched"].step()
            objects["picky"].value += 1


def everything(model: torch.nn.Module, opt: torch.optim.Optimizer, objects: dict[str, Any]) -> Any:
    """Copies of what a load restores."""
    def copied(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return value.detach().clone()
        if isinstance(value, dict):
            return {k: copied(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [copied(v) for v in value]
        return value

    return copied({"model": model.state_dict(), "opt": opt.state_dict(), "noise": objects["noise"],
                   "sched": objects["sched"].state_dict(), "own": objects["own"].state_dict(),
                   "picky": objects["picky"].state_dict(), "rng": torch.get_rng_state()})


def same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


@pytest.fixture
def saved(tmp_path):
    t, model, opt, objects = build(seed=0)
    train(t, model, opt, objects)
    return t.save(tmp_path / "ck.pt")


def test_a_registered_object_that_refuses_its_state_leaves_the_trainer_as_it_was(saved):
    t, model, opt, objects = build(seed=1)
    train(t, model, opt, objects)  # a run of its own, whose state must survive the failed load
    objects["picky"].version = 2
    before, step = everything(model, opt, objects), t.global_step
    with pytest.raises(CheckpointError) as caught:
        t.load(saved)
    message = str(caught.value)
    assert message == (f"checkpoint {saved!r} could not be restored, and nothing was changed: registered object "
                       "'picky': this version cannot read that state"), message
    assert same(before, everything(model, opt, objects)) and t.global_step == step


def test_a_registered_optimizer_of_other_parameter_groups_leaves_the_trainer_as_it_was(tmp_path, saved):
    t, model, opt, objects = build(seed=1)
    first, second = list(model.parameters())[:2], list(model.parameters())[2:]
    objects["own"] = torch.optim.SGD([{"params": first}, {"params": second}], lr=1e-3, momentum=0.9)
    t.register_for_checkpointing(own=objects["own"])  # two groups here, one in the checkpoint
    before, step = everything(model, opt, objects), t.global_step
    with pytest.raises(CheckpointError, match=r"could not be restored, and nothing was changed: registered object "
                                              r"'own': .*parameter groups"):
        t.load(saved)
    assert same(before, everything(model, opt, objects)) and t.global_step == step


def test_a_failed_load_then_a_good_one_restores_the_saved_run(saved):
    reference, ref_model, ref_opt, ref_objects = build(seed=0)
    train(reference, ref_model, ref_opt, ref_objects)
    t, model, opt, objects = build(seed=1)
    objects["picky"].version = 2
    with pytest.raises(CheckpointError):
        t.load(saved)
    objects["picky"].version = 1
    t.load(saved)
    ref_state, state = everything(ref_model, ref_opt, ref_objects), everything(model, opt, objects)
    ref_state.pop("rng"), state.pop("rng")
    assert same(ref_state, state) and t.global_step == reference.global_step == 3
