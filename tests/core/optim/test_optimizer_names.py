"""The name an optimizer's state is checkpointed under, whatever form its parameters are given in."""

from __future__ import annotations

import pytest
import torch

import devplug


def test_named_parameters_key_the_optimizer_by_its_module_as_plain_parameters_do(tmp_path):
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False)
    generator = trainer.setup(torch.nn.Linear(3, 3), name="generator")
    critic = trainer.setup(torch.nn.Linear(3, 1), name="critic")
    trainer.optimizer("adam", generator.named_parameters())
    trainer.optimizer("adam", [{"params": list(critic.named_parameters()), "lr": 0.1}])
    assert sorted(trainer._optimizers) == ["critic", "generator"]


def test_parameter_groups_given_as_generators_keep_their_parameters():
    # torch's own idiom, [{"params": layer.parameters(), "lr": ...}]: finding the module that owns them must
    # not use the generators up, leaving the optimizer with empty groups that never train
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False)
    model = trainer.setup(torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Linear(3, 1)), name="model")
    for algorithm, options in (("adam", {}), ("adam", {"differentiable": True}), ("sgd", {"foreach": True})):
        groups = [{"params": model[0].parameters(), "lr": 0.1}, {"params": model[1].parameters(), "lr": 0.01}]
        optimizer = trainer.optimizer(algorithm, groups, name=f"{algorithm}{len(trainer._optimizers)}", **options)
        assert [len(g["params"]) for g in optimizer.param_groups] == [2, 2]
    named = trainer.optimizer("sgd", [{"params": model.named_parameters()}], lr=0.1)
    assert named.param_groups[0]["params"] == list(model.parameters())
    assert "model" in trainer._optimizers  # keyed by the module that owns them


def test_a_parameter_group_without_params_is_one_line():
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False)
    trainer.setup(torch.nn.Linear(2, 1))
    with pytest.raises(devplug.OptimizerError, match=r"parameter group 0 has no 'params'"):
        trainer.optimizer("adam", [{"lr": 0.1}])
