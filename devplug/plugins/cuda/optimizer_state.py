"""NVIDIA apex optimizer state to and from torch.optim's layout, so a checkpoint moves between devices.

apex's layouts (``apex/optimizers/fused_adam.py``, ``fused_sgd.py``): ``FusedAdam`` counts steps once per
parameter group (``group["step"]``, an ``int``, a tensor when ``capturable``) and keeps ``exp_avg`` and
``exp_avg_sq`` per parameter (float32); its groups have ``bias_correction`` and no ``amsgrad``,
``maximize`` or ``decoupled_weight_decay`` (Adam or AdamW is the optimizer's ``adam_w_mode``).
``FusedSGD`` keeps a ``momentum_buffer`` per parameter, created (zero) even without momentum, where
torch keeps none. ``FusedLAMB`` has no torch.optim counterpart, so its state is saved as it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from devplug.toolkit import (
    bias_corrected_to_canonical,
    momentum_from_canonical,
    momentum_to_canonical,
    native_groups,
    steps_to_groups,
)

FUSED_ADAM, FUSED_SGD = "apex.optimizers.FusedAdam", "apex.optimizers.FusedSGD"


def fused_adam_to_canonical(optimizer: torch.optim.Optimizer, state: Mapping[str, Any]) -> dict[str, Any]:
    """apex ``FusedAdam`` state in torch.optim.Adam's layout (``decoupled_weight_decay`` from ``adam_w_mode``)."""
    # adam_w_mode: apex FusedAdam's own attribute
    canonical = bias_corrected_to_canonical(state, decoupled=bool(optimizer.adam_w_mode))  # type: ignore[attr-defined]
    for group in canonical["param_groups"]:  # a capturable FusedAdam keeps lr as a device tensor
        if isinstance(group.get("lr"), torch.Tensor):
            group["lr"] = float(group["lr"])
    return canonical


def fused_adam_from_canonical(optimizer: torch.optim.Optimizer, state: Mapping[str, Any]) -> dict[str, Any]:
    """torch.optim.Adam/AdamW state for apex ``FusedAdam``: one step count per group, apex's group keys."""
    decoupled = bool(optimizer.adam_w_mode)  # type: ignore[attr-defined]  # apex FusedAdam's own attribute
    for group in state["param_groups"]:
        if group.get("weight_decay") and bool(group.get("decoupled_weight_decay")) != decoupled:
            kinds = ("L2", "decoupled") if decoupled else ("decoupled", "L2")
            raise ValueError(f"the state has {kinds[0]} weight decay, this FusedAdam applies {kinds[1]} "
                             f"(adam_w_mode={decoupled})")
    native = steps_to_groups(state)
    native["param_groups"] = native_groups(optimizer, native["param_groups"], "adam", implementation=FUSED_ADAM,
                                           refuse=("amsgrad", "maximize"))
    if getattr(optimizer, "capturable", False):
        # apex keeps a capturable optimizer's step and lr as device tensors, and its capturable kernel takes
        # lr only as a tensor (apex/optimizers/fused_adam.py, csrc/amp_C_frontend.cpp)
        for group, current in zip(native["param_groups"], optimizer.param_groups, strict=True):
            device = current["params"][0].device
            if "step" in group:
                group["step"] = torch.tensor([group["step"]], dtype=torch.int, device=device)
            if not isinstance(group.get("lr"), torch.Tensor):
                group["lr"] = torch.tensor(float(group["lr"]), dtype=torch.float32, device=device)
    return native


def fused_sgd_to_canonical(optimizer: torch.optim.Optimizer, state: Mapping[str, Any]) -> dict[str, Any]:
    """apex ``FusedSGD`` state in torch.optim.SGD's layout (no momentum buffers without momentum)."""
    if getattr(optimizer, "wd_after_momentum", False):
        raise ValueError("wd_after_momentum=True has no torch.optim counterpart")
    return momentum_to_canonical(state)


def fused_sgd_from_canonical(optimizer: torch.optim.Optimizer, state: Mapping[str, Any]) -> dict[str, Any]:
    """torch.optim.SGD state for apex ``FusedSGD``: its momentum buffers as they are, apex's group keys."""
    return momentum_from_canonical(optimizer, state, implementation=FUSED_SGD)


#: Converters for each apex class with a torch.optim counterpart (FusedLAMB has none).
CONVERTERS: dict[str, dict[str, Any]] = {
    "FusedAdam": {"to_canonical": fused_adam_to_canonical, "from_canonical": fused_adam_from_canonical},
    "FusedSGD": {"to_canonical": fused_sgd_to_canonical, "from_canonical": fused_sgd_from_canonical},
}
