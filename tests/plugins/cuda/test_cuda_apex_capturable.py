"""apex ``FusedAdam(capturable=True)`` and ``master_weights`` through the CUDA plugin, against the apex stand-in.

The stand-in mirrors NVIDIA/apex ``apex/optimizers/fused_adam.py`` (cited there): a capturable
optimizer keeps ``lr`` as a tensor, its kernel takes nothing else, and its step unscales gradients
with the GradScaler it is handed whether or not they were unscaled already. The scaler here is
torch's real ``torch.amp.GradScaler`` (on the CPU, where the stand-in computes).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import devplug
from devplug.plugins.cuda import optimizers

STANDINS = Path(__file__).resolve().parents[2] / "standins"


@pytest.fixture
def apex(monkeypatch: pytest.MonkeyPatch):
    """The NVIDIA apex stand-in, importable as ``apex``; yields ``apex.optimizers``."""
    for name in [n for n in sys.modules if n == "apex" or n.startswith("apex.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.syspath_prepend(str(STANDINS / "apex_standin"))
    import apex.optimizers

    apex.optimizers.CALLS.clear()
    apex.optimizers.STEPS.clear()
    yield apex.optimizers
    for name in [n for n in sys.modules if n == "apex" or n.startswith("apex.")]:
        del sys.modules[name]


def weight() -> torch.nn.Parameter:
    return torch.nn.Parameter(torch.ones(4))


def test_capturable_fused_adam_steps_after_loading_a_torch_layout_checkpoint(apex):
    # A run saved with torch.optim.Adam (or converted to the canonical layout) has lr as a float.
    source_param = weight()
    torch_adam = torch.optim.Adam([source_param], lr=1e-3)
    source_param.grad = torch.full((4,), 0.5)
    torch_adam.step()
    canonical = torch_adam.state_dict()

    param = weight()
    choice = optimizers.build_optimizer("adam", [param], {"lr": 1e-3, "capturable": True})
    assert isinstance(choice.optimizer, apex.FusedAdam)
    choice.optimizer.load_state_dict(choice.from_canonical(choice.optimizer, canonical))
    group = choice.optimizer.param_groups[0]
    assert isinstance(group["lr"], torch.Tensor) and float(group["lr"]) == pytest.approx(1e-3)
    param.grad = torch.full((4,), 0.5)
    choice.optimizer.step()  # apex's capturable kernel takes lr only as a tensor
    assert int(group["step"]) == 2
    saved = choice.to_canonical(choice.optimizer, choice.optimizer.state_dict())
    assert isinstance(saved["param_groups"][0]["lr"], float)  # torch's layout again


def scaled_step(apex, *, unscale_first: bool, grad: float = 1e-3) -> torch.Tensor:
    param = weight()
    choice = optimizers.build_optimizer("adam", [param], {"lr": 1e-3, "capturable": True})
    scaler = torch.amp.GradScaler("cpu", init_scale=65536.0)
    scaler.scale((param * grad).sum()).backward()
    if unscale_first:  # what clip_grad_norm does before clipping
        scaler.unscale_(choice.optimizer)
        torch.nn.utils.clip_grad_norm_([param], max_norm=1.0)
    with pytest.warns(FutureWarning, match="GradScaler is going to stop passing itself"):
        scaler.step(choice.optimizer)
    scaler.update()
    return apex.STEPS[-1]


def test_capturable_with_a_grad_scaler_unscales_once_without_clipping(apex):
    assert torch.allclose(scaled_step(apex, unscale_first=False), torch.full((4,), 1e-3))


def test_capturable_with_a_grad_scaler_and_clipping_does_not_unscale_twice(apex):
    # Before: clip_grad_norm's unscale_, then apex's own 1/scale: 1e-3 arrived as 1.5e-8.
    assert torch.allclose(scaled_step(apex, unscale_first=True), torch.full((4,), 1e-3))


def test_capturable_after_unscale_still_skips_a_step_with_inf_gradients(apex):
    param = weight()
    choice = optimizers.build_optimizer("adam", [param], {"lr": 1e-3, "capturable": True})
    scaler = torch.amp.GradScaler("cpu", init_scale=4.0)
    scaler.scale((param * float("inf")).sum()).backward()
    scaler.unscale_(choice.optimizer)
    with pytest.warns(FutureWarning):
        scaler.step(choice.optimizer)
    scaler.update()
    assert torch.equal(param.detach(), torch.ones(4)) and scaler.get_scale() == 2.0


def test_master_weights_without_capturable_is_the_combination_apex_refuses(apex):
    with pytest.raises(devplug.OptimizerError, match=r"master_weights=True only with capturable=True"):
        optimizers.build_optimizer("adam", [weight()], {"master_weights": True})
    choice = optimizers.build_optimizer("adam", [weight()], {"master_weights": True, "capturable": True})
    assert isinstance(choice.optimizer, apex.FusedAdam)
