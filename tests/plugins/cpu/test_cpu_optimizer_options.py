"""The CPU device's optimizers: options torch's fused CPU kernels refuse, and options no torch optimizer takes."""

from __future__ import annotations

import pytest
import torch

import devplug
from devplug.plugins.cpu import plugin as cpu_plugin


def _trainer_and_model() -> tuple[devplug.Trainer, torch.nn.Module]:
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False)
    return trainer, trainer.setup(torch.nn.Linear(3, 2))


@pytest.mark.parametrize("name", ["adam", "sgd"])
def test_an_option_the_fused_kernel_refuses_builds_torchs_default_kernel(name):
    if not cpu_plugin.supports_fused(name):
        pytest.skip(f"this torch has no fused CPU {name}")
    trainer, model = _trainer_and_model()
    optimizer = trainer.optimizer(name, model.parameters(), lr=0.1, differentiable=True)
    group = optimizer.param_groups[0]
    assert group["differentiable"] is True and not group.get("fused")
    assert trainer.optimizer_implementation(optimizer) == f"torch.optim.{type(optimizer).__name__}"
    assert trainer._optimizers["linear"].reason.startswith("fused=True does not take these options")


@pytest.mark.parametrize(("name", "options", "message"), [
    ("sgd", {"lr": 0.1, "betas": (0.9, 0.99)}, r"cannot build torch\.optim\.SGD with \['betas', 'lr'\]: .*'betas'"),
    ("adam", {"lr": -1.0}, r"cannot build torch\.optim\.Adam with \['lr'\]: Invalid learning rate: -1\.0"),
    ("adam", {"lr": 0.1, "fused": True, "weight_decay": -1}, r"cannot build torch\.optim\.Adam with .*weight_decay"),
])
def test_an_option_torch_refuses_is_the_authors_error_in_one_line_not_the_plugins(name, options, message):
    trainer, model = _trainer_and_model()
    with pytest.raises(devplug.OptimizerError, match=message) as caught:
        trainer.optimizer(name, model.parameters(), **options)
    assert "plugin" not in str(caught.value) and "\n" not in str(caught.value)


def test_a_sharding_plans_kernel_that_refuses_the_authors_options_gives_way_to_torchs_default():
    from devplug.core.optim.torch_optimizers import sharded_torch_optimizer

    weight = torch.nn.Parameter(torch.ones(3))
    choice = sharded_torch_optimizer("adam", iter([weight]), {"lr": 0.1, "differentiable": True}, "fused",
                                     "the plan's reason")
    assert choice.implementation == "torch.optim.Adam" and not choice.optimizer.defaults["fused"]
    assert "fused=True does not take these options" in choice.reason
    assert choice.optimizer.param_groups[0]["params"] == [weight]


@pytest.mark.parametrize("name", ["adam", "sgd"])
def test_parameter_groups_the_fused_kernel_refused_are_left_as_the_author_gave_them(name):
    # a refused fused attempt must not leave fused=True in the author's group dicts: the default kernel
    # built over them would then run fused, and fail at the first step
    if not cpu_plugin.supports_fused(name):
        pytest.skip(f"this torch has no fused CPU {name}")
    trainer, model = _trainer_and_model()
    groups = [{"params": [model.weight], "lr": 0.1}, {"params": [model.bias], "lr": 0.01}]
    optimizer = trainer.optimizer(name, groups, differentiable=True)
    assert [g.get("fused") for g in optimizer.param_groups] == [None, None]
    assert [g["lr"] for g in optimizer.param_groups] == [0.1, 0.01]
    assert trainer.optimizer_implementation(optimizer) == f"torch.optim.{type(optimizer).__name__}"


def test_the_default_kernel_after_a_refused_one_is_built_over_the_authors_groups_unchanged():
    from devplug.core.optim.torch_optimizers import sharded_torch_optimizer

    weight = torch.nn.Parameter(torch.ones(3))
    groups = [{"params": [weight], "lr": 0.5}]
    choice = sharded_torch_optimizer("adam", groups, {"lr": 0.1, "differentiable": True}, "fused", "the plan's")
    assert choice.implementation == "torch.optim.Adam"
    assert not choice.optimizer.param_groups[0]["fused"] and choice.optimizer.param_groups[0]["lr"] == 0.5


def test_the_fused_optimizer_holds_the_authors_group_dicts_as_torch_does():
    trainer, model = _trainer_and_model()
    groups = [{"params": [model.weight], "lr": 0.1}, {"params": [model.bias], "lr": 0.01}]
    optimizer = trainer.optimizer("adam", groups)
    assert all(held is given for held, given in zip(optimizer.param_groups, groups, strict=True))
