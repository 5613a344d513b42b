"""The DCGAN step's generator update: D takes no weight gradients there, and G learns exactly as without that."""

from __future__ import annotations

import pytest
import torch

import devplug

from dcgan import step as step_module  # examples/dcgan/step.py
from dcgan.models import PRESETS

BATCH = 8


def _train(steps: int, **options: bool) -> tuple[step_module.DCGANStep, list[int]]:
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False, seed=0)
    spec = PRESETS["tiny-32"]
    step = step_module.DCGANStep(trainer, spec, **options)
    gradients_of_d: list[int] = []
    for p in step.net_d.parameters():
        p.register_hook(lambda grad: gradients_of_d.append(1) or grad)  # once per backward that reaches p
    images = torch.rand(BATCH * steps, 3, spec.image_size, spec.image_size, generator=torch.Generator().manual_seed(1))
    loader = trainer.dataloader(torch.utils.data.TensorDataset(images * 2 - 1), batch_size=BATCH, num_workers=0)
    for _ in trainer.epochs(1, max_steps=steps):
        for (real,) in loader:
            step(real)
    return step, gradients_of_d



def test_the_generator_step_computes_no_discriminator_weight_gradients():
    step, gradients_of_d = _train(3)
    # one gradient per D parameter per step: the D step's backward (real and fake summed), none from the G step
    assert len(gradients_of_d) == 3 * len(list(step.net_d.parameters()))
    assert all(p.requires_grad for p in step.net_d.parameters())  # unfrozen again after the step


def test_freezing_d_leaves_both_networks_training_exactly_as_before():
    frozen, _ = _train(4)
    plain, gradients_of_d = _train(4, freeze_d=False)
    assert len(gradients_of_d) == 2 * 4 * len(list(plain.net_d.parameters()))  # the upstream step, for contrast
    for ours, theirs in ((frozen.net_g, plain.net_g), (frozen.net_d, plain.net_d)):
        for (name, a), b in zip(ours.state_dict().items(), theirs.state_dict().values(), strict=True):
            assert torch.equal(a, b), name


def test_frozen_restores_requires_grad_after_an_error():
    module = torch.nn.Linear(2, 2)
    module.bias.requires_grad_(False)
    with pytest.raises(RuntimeError), step_module.frozen(module):
        assert not module.weight.requires_grad
        raise RuntimeError("inside")
    assert module.weight.requires_grad and not module.bias.requires_grad
