"""The name an optimizer's state is checkpointed under, whatever form its parameters are given in."""

from __future__ import annotations

import torch

import devplug


def test_named_parameters_key_the_optimizer_by_its_module_as_plain_parameters_do(tmp_path):
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False)
    generator = trainer.setup(torch.nn.Linear(3, 3), name="generator")
    critic = trainer.setup(torch.nn.Linear(3, 1), name="critic")
    trainer.optimizer("adam", generator.named_parameters())
    trainer.optimizer("adam", [{"params": list(critic.named_parameters()), "lr": 0.1}])
    assert sorted(trainer._optimizers) == ["critic", "generator"]
