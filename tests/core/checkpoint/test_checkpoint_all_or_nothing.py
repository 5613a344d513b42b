"""A load restores everything or nothing: the objects registered for checkpointing take part in the same restore
as the modules and optimizers, so one whose ``load_state_dict`` refuses the saved state leaves the whole
Trainer as it was (weights, optimizer, position, other registered objects), with one CheckpointError line."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from dist_scripts.fsdp_model import Picky
from torch.utils.data import TensorDataset

import devplug
from devplug.core.errors import CheckpointError


def make_model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))


def build(seed: int, **options: Any) -> tuple[devplug.Trainer, torch.nn.Module, torch.optim.Optimizer, dict[str, Any]]:
    t = devplug.Trainer(device="cpu", precision="32-true", progress=False, seed=seed, **options)
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


# ---- sharded checkpoints (FSDP in one process) and plain files loaded into a sharded run ------------------------
def _lm_run(seed: int, strategy: str = "auto") -> tuple[devplug.Trainer, torch.nn.Module, torch.optim.Optimizer,
                                                         Picky]:
    from dist_scripts.fsdp_model import Block, make_lm

    t = devplug.Trainer(device="cpu", precision="32-true", progress=False, seed=seed, strategy=strategy)
    shard = {"shard": [Block]} if strategy == "fsdp" else {}
    model = t.setup(make_lm(seed), name="lm", **shard)
    opt = t.optimizer("adamw", model.parameters(), lr=1e-2)
    picky = Picky()
    t.register_for_checkpointing(picky=picky)
    return t, model, opt, picky


def _lm_steps(t: devplug.Trainer, model: torch.nn.Module, opt: torch.optim.Optimizer, picky: Picky) -> None:
    from dist_scripts.fsdp_model import lm_loss, rank_batch

    for step in range(2):
        t.backward(lm_loss(model, rank_batch(step, 0, 1)))
        t.step(opt)
        picky.value += 1


def _full(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return (value.full_tensor() if hasattr(value, "full_tensor") else value).detach().clone()
    if isinstance(value, dict):
        return {k: _full(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_full(v) for v in value]
    return value


def _lm_state(model: torch.nn.Module, opt: torch.optim.Optimizer, picky: Picky) -> Any:
    return _full({"model": model.state_dict(), "opt": opt.state_dict(), "picky": picky.state_dict(),
                  "rng": torch.get_rng_state()})


@pytest.mark.parametrize("saved_as, loaded_by", [("fsdp", "auto"), ("fsdp", "fsdp"), ("auto", "fsdp")])
def test_a_sharded_load_whose_registered_object_refuses_its_state_changes_nothing(tmp_path, saved_as, loaded_by):
    first = _lm_run(0, saved_as)
    _lm_steps(*first)
    path = first[0].save(tmp_path / ("folder" if saved_as == "fsdp" else "plain.pt"))
    t, model, opt, picky = _lm_run(1, loaded_by)
    _lm_steps(t, model, opt, picky)
    picky.version = 2
    before, step = _lm_state(model, opt, picky), t.global_step
    with pytest.raises(CheckpointError) as caught:
        t.load(path)
    assert str(caught.value) == (f"checkpoint {path!r} could not be restored, and nothing was changed: registered "
                                 "object 'picky': this version cannot read that state")
    assert same(before, _lm_state(model, opt, picky)) and t.global_step == step
    picky.version = 1
    t.load(path)  # and then loads as a good checkpoint does
    assert same(_full(first[1].state_dict()), _full(model.state_dict())) and picky.value == 2


def test_a_sharded_read_failing_half_way_says_the_weights_may_be_part_loaded(tmp_path, monkeypatch):
    from devplug.core.checkpoint import safe_dcp

    first = _lm_run(0, "fsdp")
    _lm_steps(*first)
    path = first[0].save(tmp_path / "folder")
    t, model, opt, picky = _lm_run(1)
    calls = []
    real = safe_dcp.SafeLoadPlanner.commit_tensor

    def failing(self: Any, read_item: Any, tensor: torch.Tensor) -> None:
        calls.append(read_item)
        if len(calls) == 3:
            raise OSError("Input/output error")
        real(self, read_item, tensor)

    monkeypatch.setattr(safe_dcp.SafeLoadPlanner, "commit_tensor", failing)
    before = _lm_state(model, opt, picky)
    with pytest.raises(CheckpointError, match=r"could not be read \(.*Input/output error.*\) after part of it was "
                                              r"copied into this run's weights and optimizer states: load an "
                                              r"intact checkpoint before training on") as caught:
        t.load(path)
    assert "\n" not in str(caught.value)
    after = _lm_state(model, opt, picky)
    assert same(before["picky"], after["picky"]) and same(before["rng"], after["rng"])  # the cheap parts put back
    monkeypatch.undo()
    t.load(path)  # a load that succeeds writes over all of it
    assert same(_full(first[1].state_dict()), _full(model.state_dict()))


# ---- a registered format whose load restores the run its own way -----------------------------------------------
class OwnWay(devplug.toolkit.CheckpointFormat):
    """Restores the modules itself (not through ``run.load``), so the Trainer restores the registered objects."""

    name = "own-way"

    def save(self, run: Any, path: Any, extra: Any, *, main: bool, async_save: bool = False) -> str | None:
        return run.save(path, extra) if main else None

    def load(self, run: Any, path: Any) -> dict[str, Any]:
        from devplug.core.checkpoint.file import read_checkpoint

        state = read_checkpoint(path)
        for key, module in run.modules.items():
            module.load_state_dict(state["modules"][key])
        return dict(state["extra"])

    def recognises(self, path: Any) -> bool:
        return path.suffix == ".own" and path.is_file()


@pytest.fixture
def own_way():
    from devplug.core.checkpoint.format import unregister_format

    devplug.toolkit.register_checkpoint_format(OwnWay)
    yield
    unregister_format(OwnWay.name)


def test_after_a_format_that_restores_its_own_way_the_trainer_restores_the_registered_objects(tmp_path, own_way):
    t, model, opt, objects = build(seed=0, checkpoint_format="own-way")
    train(t, model, opt, objects)
    path = t.save(tmp_path / "ck.own")
    second, model2, _opt2, objects2 = build(seed=1, checkpoint_format="own-way")
    second.load(path)
    assert objects2["picky"].value == 3 and torch.equal(objects2["noise"], torch.zeros(2, 3))
    assert same(_full(model.state_dict()), _full(model2.state_dict()))
    third, _model3, _opt3, objects3 = build(seed=1, checkpoint_format="own-way")
    objects3["picky"].version = 2
    with pytest.raises(CheckpointError, match=r"could not be restored \(registered object 'picky': this version "
                                              r"cannot read that state\), and what the own-way format restored "
                                              r"could not be put back"):
        third.load(path)
    assert torch.equal(objects3["noise"], torch.ones(2, 3))  # the registered objects restored before it, put back


@pytest.mark.slow
def test_a_rank_whose_registered_object_refuses_makes_every_rank_raise_and_none_wait(tmp_path):
    from dist_scripts.common import HERE, run_ranks

    done = run_ranks(HERE / "sharded_refused.py", [str(tmp_path)], world_size=2, timeout=240, expect_code=3)
    lines = [next(line for line in p.stdout.splitlines() if line.startswith("rank ")) for p in done]
    assert lines[1].startswith("rank 1: CheckpointError: checkpoint ") and lines[1].endswith(
        "could not be restored, and nothing was changed: registered object 'picky': this version cannot read that "
        "state | weights kept: True | position kept: True"), lines[1]
    assert lines[0].startswith("rank 0: CheckpointError: checkpoint ") and lines[0].endswith(
        "could not be restored on rank 1 (its error says why), and nothing was changed | weights kept: True | "
        "position kept: True"), lines[0]
