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
    native_groups,
    steps_to_groups,
    steps_to_params,
    torch_optimizer_class,
    torch_optimizer_defaults,
)


def _torch_only(optimizer: torch.optim.Optimizer, name: str) -> set[str]:
    return set(torch_optimizer_defaults(torch_optimizer_class(name))) - set(optimizer.defaults)


def _refuse(group: Mapping[str, Any], implementation: str, *flags: str) -> None:
    for flag in flags:
        if group.get(flag):
            raise ValueError(f"{implementation} has no {flag}=True")


def fused_adamw_to_canonical(optimizer: torch.optim.Optimizer, state: Mapping[str, Any], *,
                             decoupled: bool) -> dict[str, Any]:
    """``FusedAdamW`` state in torch.optim.Adam/AdamW's layout; ``decoupled`` is the torch group's flag."""
    canonical = steps_to_params(state)
    for group in canonical["param_groups"]:
        if not group.pop("bias_correction", True):
            raise ValueError("bias_correction=False has no torch.optim counterpart")
        group["decoupled_weight_decay"] = decoupled
    return canonical


def fused_adamw_from_canonical(optimizer: torch.optim.Optimizer, state: Mapping[str, Any], *,
                               name: str) -> dict[str, Any]:
    """torch.optim.Adam/AdamW (``name``) state for ``FusedAdamW``: one step count per group, its own keys."""
    for group in state["param_groups"]:
        _refuse(group, "FusedAdamW", "amsgrad", "maximize")
        if group.get("weight_decay") and not group.get("decoupled_weight_decay"):
            raise ValueError("the state has Adam's L2 weight decay, and FusedAdamW decays weights decoupled (AdamW)")
    native = steps_to_groups(state, param_step=0)
    native["param_groups"] = native_groups(optimizer, native["param_groups"], _torch_only(optimizer, name))
    return native


def fused_sgd_to_canonical(optimizer: torch.optim.Optimizer, state: Mapping[str, Any]) -> dict[str, Any]:
    """``FusedSGD`` state in torch.optim.SGD's layout (momentum buffers only where there is momentum)."""
    kept = {index for group in state["param_groups"] if group.get("momentum") for index in group["params"]}
    per_param = {index: dict(entry) for index, entry in state["state"].items() if index in kept}
    return {"state": per_param, "param_groups": [dict(group) for group in state["param_groups"]]}


def fused_sgd_from_canonical(optimizer: torch.optim.Optimizer, state: Mapping[str, Any]) -> dict[str, Any]:
    """torch.optim.SGD state for ``FusedSGD``: the momentum buffers as they are, its own group keys."""
    for group in state["param_groups"]:
        _refuse(group, "FusedSGD", "maximize")
    groups = native_groups(optimizer, state["param_groups"], _torch_only(optimizer, "sgd"))
    return {"state": {index: dict(entry) for index, entry in state["state"].items()}, "param_groups": groups}


Converter = Callable[[torch.optim.Optimizer, Mapping[str, Any]], dict[str, Any]]


def converters(hpex_class: str, name: str, options: Mapping[str, Any]) -> dict[str, Converter]:
    """``to_canonical``/``from_canonical`` for a Habana fused optimizer built for torch optimizer ``name``."""
    if hpex_class == "FusedSGD":
        return {"to_canonical": fused_sgd_to_canonical, "from_canonical": fused_sgd_from_canonical}
    decoupled = name == "adamw" or bool(options.get("decoupled_weight_decay", False))
    return {"to_canonical": functools.partial(fused_adamw_to_canonical, decoupled=decoupled),
            "from_canonical": functools.partial(fused_adamw_from_canonical, name=name)}
