"""Large-batch learning rates: scaling rules, warmup, cosine decay, and resume-safe application."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

import devplug
from devplug.core.errors import ConfigError
from devplug.core.optim.schedules import DECAYS, LR_SCALING_RULES, cosine_factor, warmup_factor


@pytest.mark.parametrize(
    ("rule", "expected"),
    [("none", 2e-4), ("linear", 2e-4 * 8), ("sqrt", 2e-4 * math.sqrt(8))],
)
def test_scale_lr_by_global_batch(rule, expected):
    assert devplug.scale_lr(2e-4, global_batch_size=512, base_batch_size=64, rule=rule) == pytest.approx(expected)


def test_scale_lr_is_identity_at_the_base_batch_and_shrinks_below_it():
    for rule in LR_SCALING_RULES:
        assert devplug.scale_lr(0.1, 64, 64, rule) == pytest.approx(0.1)
    assert devplug.scale_lr(0.1, 16, 64, "sqrt") == pytest.approx(0.05)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((0.1, 64, 64, "cubic"), "unknown learning-rate scaling rule 'cubic'; use one of none, linear, sqrt"),
        ((0.1, 0, 64, "linear"), "global_batch_size must be a positive integer, got 0"),
        ((0.1, 64, 6.4, "linear"), "base_batch_size must be a positive integer, got 6.4"),
    ],
)
def test_scale_lr_rejects_bad_input_clearly(args, message):
    with pytest.raises(ConfigError, match=message):
        devplug.scale_lr(*args)


def test_warmup_ramps_linearly_to_one():
    assert [warmup_factor(s, 4) for s in range(1, 7)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert warmup_factor(0, 4) == 0.25  # never zero
    assert warmup_factor(1, 0) == 1.0


def test_cosine_goes_from_one_to_the_floor():
    assert cosine_factor(10, 110, warmup_steps=10) == pytest.approx(1.0)
    assert cosine_factor(60, 110, warmup_steps=10) == pytest.approx(0.5)
    assert cosine_factor(110, 110, warmup_steps=10) == pytest.approx(0.0)
    assert cosine_factor(500, 110, warmup_steps=10, min_factor=0.1) == pytest.approx(0.1)


def test_schedule_shape_warmup_then_cosine():
    schedule = devplug.LRSchedule(total_steps=100, warmup_steps=10, decay="cosine", min_factor=0.0)
    factors = [schedule.factor(s) for s in range(1, 101)]
    assert factors[:10] == pytest.approx([s / 10 for s in range(1, 11)])
    after = factors[10:]
    assert all(a >= b for a, b in itertools.pairwise(after))  # monotone decay
    assert factors[54] == pytest.approx(0.5)  # halfway through the decay (step 55)
    assert factors[-1] == pytest.approx(0.0)


def test_linear_and_constant_decays():
    linear = devplug.LRSchedule(total_steps=20, warmup_steps=0, decay="linear", min_factor=0.5)
    assert [linear.factor(s) for s in (0, 10, 20, 30)] == pytest.approx([1.0, 0.75, 0.5, 0.5])
    constant = devplug.LRSchedule(total_steps=20, warmup_steps=5, decay="none")
    assert [constant.factor(s) for s in (1, 5, 6, 1000)] == pytest.approx([0.2, 1.0, 1.0, 1.0])


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"total_steps": 0}, "total_steps must be a positive integer"),
        ({"total_steps": 10, "warmup_steps": -1}, "warmup_steps must be an integer >= 0"),
        ({"total_steps": 10, "decay": "step"}, f"unknown decay 'step'; use one of {', '.join(DECAYS)}"),
        ({"total_steps": 10, "min_factor": 2}, "min_factor must be between 0 and 1"),
        ({"total_steps": 10, "min_factor": "0.1x"}, "min_factor must be a number between 0 and 1, got '0.1x'"),
        ({"total_steps": 10, "min_factor": None}, "min_factor must be a number between 0 and 1, got None"),
        ({"total_steps": 1000, "warmup_steps": 2000},
         r"warmup_steps \(2000\) is past total_steps \(1000\): the cosine decay would have no steps "
         r"and the learning rate drop from its peak to min_factor at once"),
    ],
)
def test_schedule_rejects_bad_options_clearly(options, message):
    with pytest.raises(ConfigError, match=message):
        devplug.LRSchedule(**options)


def test_a_warmup_past_total_steps_is_fine_without_a_decay_and_a_warmup_to_the_end_with_one():
    assert devplug.LRSchedule(total_steps=10, warmup_steps=20, decay="none").factor(15) == pytest.approx(0.75)
    assert devplug.LRSchedule(total_steps=10, warmup_steps=10).factor(10) == 1.0


def _optimizer() -> torch.optim.Optimizer:
    a, b = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2))
    return torch.optim.SGD([{"params": [a], "lr": 0.1}, {"params": [b], "lr": 0.01}], lr=0.1)


def test_apply_scales_each_group_from_its_own_peak_and_is_stateless():
    schedule = devplug.LRSchedule(total_steps=10, warmup_steps=2, decay="cosine")
    opt = _optimizer()
    assert schedule.apply(opt, 1) == pytest.approx(0.5)
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.05, 0.005])
    schedule.apply(opt, 2)
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.1, 0.01])
    # a resumed run (a fresh optimizer loaded from a checkpoint) gets the same rate at the same step
    resumed = _optimizer()
    resumed.load_state_dict(opt.state_dict())
    schedule.apply(opt, 7)
    schedule.apply(resumed, 7)
    assert [g["lr"] for g in resumed.param_groups] == pytest.approx([g["lr"] for g in opt.param_groups])
    assert resumed.param_groups[0]["initial_lr"] == 0.1


def test_lambda_lr_scheduler_matches_apply():
    schedule = devplug.LRSchedule(total_steps=12, warmup_steps=3, decay="cosine", min_factor=0.1)
    with_scheduler, with_apply = _optimizer(), _optimizer()
    scheduler = schedule.scheduler(with_scheduler)
    for step in range(1, 15):
        schedule.apply(with_apply, step)
        assert with_scheduler.param_groups[0]["lr"] == pytest.approx(with_apply.param_groups[0]["lr"]), step
        with_scheduler.step()
        scheduler.step()


def test_schedules_work_with_the_trainer_step_counter():
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False)
    model = trainer.setup(torch.nn.Linear(3, 1))
    base_lr = devplug.scale_lr(0.05, global_batch_size=4 * trainer.world_size, base_batch_size=4, rule="sqrt")
    opt = trainer.optimizer("sgd", model.parameters(), lr=base_lr)
    schedule = devplug.LRSchedule(total_steps=6, warmup_steps=2)
    data = torch.utils.data.TensorDataset(torch.randn(24, 3), torch.randn(24, 1))
    loader = trainer.dataloader(data, batch_size=4, num_workers=0)
    seen = []
    for _ in trainer.epochs(1):
        for x, y in loader:
            schedule.apply(opt, trainer.global_step)
            seen.append(opt.param_groups[0]["lr"])
            trainer.backward(torch.nn.functional.mse_loss(model(x), y))
            trainer.step(opt)
    assert seen == pytest.approx([0.05 * schedule.factor(s) for s in range(1, 7)])
    assert seen[1] == pytest.approx(0.05) and seen[-1] == pytest.approx(0.0)
