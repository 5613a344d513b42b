"""The Gaudi plugin against what the Intel Gaudi bridge's code does (stand-in cited to its source).

FusedAdamW's eps placement and ``moments_dtype``, HMP's O2 and its op lists, the bridge's missing
``__version__``, and lazy-mode step marking with gradient accumulation (Habana's own integrations mark
the step after every backward).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from standins import hpu_fixtures
from torch import nn

import devplug

DOCS = Path(__file__).resolve().parents[3] / "docs" / "devices" / "hpu.md"


@pytest.fixture
def hpu(monkeypatch: pytest.MonkeyPatch):
    """The stand-in Gaudi stack, lazy mode, one device."""
    yield from hpu_fixtures.standin(monkeypatch)


def make_trainer(hpu: hpu_fixtures.StandIn, **options: object) -> devplug.Trainer:
    options.setdefault("precision", "auto")
    return devplug.Trainer(device="hpu", progress=False, plugin_manager=hpu.plugin_manager(), **options)


def first_step(optimizer_class: type, grad: float, **options: object) -> float:
    """The first update of a weight 0 with gradient ``grad``, in units of ``lr``."""
    weight = nn.Parameter(torch.zeros(1))
    optimizer = optimizer_class([weight], lr=1.0, weight_decay=0.0, **options)
    weight.grad = torch.full((1,), grad)
    optimizer.step()
    return -float(weight)


def test_fused_adamw_keeps_eps_outside_the_bias_correction_as_documented(hpu):
    from habana_frameworks.torch.hpex.optimizers import FusedAdamW

    fused = first_step(FusedAdamW, 1e-6, eps=1e-8)
    torch_adamw = first_step(torch.optim.AdamW, 1e-6, eps=1e-8)
    assert (round(fused, 2), round(torch_adamw, 2)) == (0.76, 0.99)
    assert first_step(FusedAdamW, 1e-2, eps=1e-8) == pytest.approx(first_step(torch.optim.AdamW, 1e-2, eps=1e-8),
                                                                   rel=1e-4)
    docs = " ".join(DOCS.read_text().split())
    assert "exactly torch's AdamW" not in docs
    assert "0.76 of `lr` on FusedAdamW and 0.99 on torch's AdamW" in docs
    from devplug.plugins.hpu import optimizers

    assert "0.76 of ``lr`` on FusedAdamW and 0.99 on torch's AdamW" in " ".join(optimizers.__doc__.split())


def test_moments_dtype_reaches_fused_adamw(hpu):
    trainer = make_trainer(hpu, precision="32-true")
    model = trainer.setup(nn.Linear(4, 2))
    optimizer = trainer.optimizer("adamw", model.parameters(), lr=1e-3, moments_dtype=torch.bfloat16)
    assert type(optimizer).__name__ == "FusedAdamW"
    assert hpu.details("FusedAdamW")[0]["moments_dtype"] is torch.bfloat16
    trainer.backward(model(torch.ones(3, 4)).sum())
    trainer.step(optimizer)
    state = optimizer.state[model.weight]
    assert state["exp_avg"].dtype == state["exp_avg_sq"].dtype == torch.bfloat16


def test_moments_dtype_without_the_fused_kernel_is_named_not_a_crash(hpu):
    from devplug.plugins.hpu import optimizers

    hpu.remove("habana_frameworks.torch.hpex.optimizers")
    choice = optimizers.build_optimizer(hpu.device(), "adamw", nn.Linear(4, 2).parameters(),
                                        {"moments_dtype": torch.bfloat16})
    assert isinstance(choice.optimizer, torch.optim.AdamW)
    assert "moments_dtype applies to FusedAdamW only" in choice.reason


def test_hmp_o2_with_op_lists_is_refused_since_hmp_ignores_them(hpu):
    with pytest.raises(devplug.PrecisionError, match=r"at opt_level 'O1' only"):
        make_trainer(hpu, device_options={"hmp": {"opt_level": "O2", "bf16_ops": ["conv2d"]}})
    trainer = make_trainer(hpu, device_options={"hmp": "O2"})
    trainer.setup(nn.Linear(2, 2))
    assert hpu.details("hmp.convert") == [{"opt_level": "O2", "bf16_ops": None, "fp32_ops": None,
                                           "isVerbose": False}]


def test_standin_has_no_version_like_the_real_bridge(hpu):
    import habana_frameworks.torch

    assert not hasattr(habana_frameworks.torch, "__version__")


def test_lazy_mode_marks_the_step_after_every_backward_with_gradient_accumulation(hpu):
    # optimum-habana 1.21.2 (optimum/habana/transformers/trainer.py line 1078) and lightning-habana 1.6.0
    # (pytorch/strategies/single.py lines 96-98, on_after_backward) call mark_step() after every backward.
    trainer = make_trainer(hpu, precision="32-true", accumulate_grad_batches=3)
    model = trainer.setup(nn.Linear(4, 1))
    optimizer = trainer.optimizer("sgd", model.parameters(), lr=0.1)
    loader = trainer.dataloader(torch.utils.data.TensorDataset(torch.ones(6, 4)), batch_size=2)
    hpu.reset()
    for _epoch in trainer.epochs(1):
        for (x,) in loader:  # one optimizer step of three micro-batches
            trainer.backward(model(x).sum())
            trainer.step(optimizer)
    calls = [n for n in hpu.names() if n in ("mark_step", "FusedSGD.step")]
    assert calls == ["mark_step", "mark_step", "mark_step", "FusedSGD.step", "mark_step"]


def test_moments_dtype_survives_a_checkpoint_round_trip(hpu):
    from devplug.plugins.hpu import optimizers

    def build() -> tuple[nn.Linear, object]:
        model = nn.Linear(4, 2)
        return model, optimizers.build_optimizer(hpu.device(), "adamw", model.parameters(),
                                                 {"moments_dtype": torch.bfloat16})

    model, choice = build()
    model(torch.ones(3, 4)).sum().backward()
    choice.optimizer.step()
    canonical = choice.to_canonical(choice.optimizer, choice.optimizer.state_dict())
    resumed_model, resumed = build()
    resumed.optimizer.load_state_dict(resumed.from_canonical(resumed.optimizer, canonical))
    state = resumed.optimizer.state[resumed_model.weight]
    # torch's load_state_dict casts state to the parameter's dtype; FusedAdamW keeps moments_dtype
    assert state["exp_avg"].dtype == state["exp_avg_sq"].dtype == torch.bfloat16
