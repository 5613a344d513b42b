"""An author's own optimizer class: built as it is, and an option it refuses is the author's one-line error."""

from __future__ import annotations

import pytest
import torch

import devplug


class ClippingAdam(torch.optim.Adam):
    """An author's Adam (a subclass, so it is built as it is rather than mapped to the device's Adam)."""


@pytest.mark.parametrize(("options", "message"), [
    ({"lr": -1.0}, r"cannot build .*ClippingAdam with \['lr'\]: Invalid learning rate: -1\.0"),
    ({"fused": True, "differentiable": True}, r"cannot build .*ClippingAdam with \['differentiable', 'fused'\]"),
    ({"betas": 0.9}, r"cannot build .*ClippingAdam with \['betas'\]"),
])
def test_an_option_the_authors_class_refuses_is_a_one_line_optimizer_error(options, message):
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False)
    model = trainer.setup(torch.nn.Linear(3, 2))
    with pytest.raises(devplug.OptimizerError, match=message) as caught:
        trainer.optimizer(ClippingAdam, model.parameters(), **options)
    assert "\n" not in str(caught.value)
