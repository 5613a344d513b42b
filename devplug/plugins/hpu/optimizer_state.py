"""Intel Gaudi optimizer state to and from torch.optim's layout, so a checkpoint moves between devices.

The layouts of ``habana_frameworks.torch.hpex.optimizers`` (``FusedAdamW.py``, ``FusedSGD.py`` in
HabanaAI/gaudi-pytorch-bridge): ``FusedAdamW`` counts steps once per parameter group (``group["step"]``,
an ``int``) and keeps per parameter ``{"step": 0, "exp_avg", "exp_avg_sq"}`` (the per-parameter step is
set once and never advanced); its groups have ``bias_correction`` and always decay weights decoupled.
``FusedSGD`` keeps a ``momentum_buffer`` per parameter when there is momentum, as torch does.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import torch

from devplug.toolkit import (
    bias_corrected_to_canonical,
    momentum_from_canonical,
    momentum_to_canonical,
    native_groups,
    steps_to_groups,
)


def fused_adamw_to_canonical(optimizer: torch.optim.Optimizer, state: Mapping[str, Any], *,
                             decoupled: bool) -> dict[str, Any]:
    """``FusedAdamW`` state in torch.optim.Adam/AdamW's layout; ``decoupled`` is the torch group's flag."""
    return bias_corrected_to_canonical(state, decoupled=decoupled)


def fused_adamw_from_canonical(optimizer: torch.optim.Optimizer, state: Mapping[str, Any], *,
                               name: str) -> dict[str, Any]:
    """torch.optim.Adam/AdamW (``name``) state for ``FusedAdamW``: one step count per group, its own keys."""
    for group in state["param_groups"]:
        if group.get("weight_decay") and not group.get("decoupled_weight_decay"):
            raise ValueError("the state has Adam's L2 weight decay, and FusedAdamW decays weights decoupled (AdamW)")
    native = steps_to_groups(state, param_step=0)
    native["param_groups"] = native_groups(optimizer, native["param_groups"], name, implementation="FusedAdamW",
                                           refuse=("amsgrad", "maximize"))
    return native


Converter = Callable[[torch.optim.Optimizer, Mapping[str, Any]], dict[str, Any]]


def converters(hpex_class: str, name: str, options: Mapping[str, Any]) -> dict[str, Converter]:
    """``to_canonical``/``from_canonical`` for a Habana fused optimizer built for torch optimizer ``name``."""
    if hpex_class == "FusedSGD":
        return {"to_canonical": lambda _optimizer, state: momentum_to_canonical(state),
                "from_canonical": functools.partial(momentum_from_canonical, implementation="FusedSGD")}
    decoupled = name == "adamw" or bool(options.get("decoupled_weight_decay", False))
    return {"to_canonical": functools.partial(fused_adamw_to_canonical, decoupled=decoupled),
            "from_canonical": functools.partial(fused_adamw_from_canonical, name=name)}
