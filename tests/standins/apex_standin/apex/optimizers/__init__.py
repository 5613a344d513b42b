"""Stand-in for NVIDIA apex's ``apex.optimizers`` (tests only, never shipped).

Constructor signatures follow NVIDIA apex's ``apex/optimizers/fused_adam.py``, ``fused_sgd.py`` and
``fused_lamb.py``. Each class is a working optimizer built on torch's (Adam/AdamW, SGD; LAMB is
approximated by AdamW) and appends ``(class name, keyword arguments)`` to :data:`CALLS`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.optim.optimizer import required

#: Constructor calls: ``(class name, {argument: value})`` without ``params``.
CALLS: list[tuple[str, dict[str, Any]]] = []

#: False mimics apex installed without ``--cuda_ext`` (its fused optimizers refuse to build).
CUDA_EXTENSIONS = True


def _check_extensions(name: str) -> None:
    if not CUDA_EXTENSIONS:
        raise RuntimeError(f"apex.optimizers.{name} requires cuda extensions")


def _zero_grad(optimizer: torch.optim.Optimizer) -> None:
    if optimizer.set_grad_none:
        for group in optimizer.param_groups:
            for param in group["params"]:
                param.grad = None
    else:
        torch.optim.Optimizer.zero_grad(optimizer)


class FusedAdam(torch.optim.Adam):
    """apex's FusedAdam: Adam, or AdamW with ``adam_w_mode=True`` (apex's default)."""

    def __init__(self, params: Any, lr: float = 1e-3, bias_correction: bool = True,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, adam_w_mode: bool = True,
                 weight_decay: float = 0.0, amsgrad: bool = False, set_grad_none: bool = True,
                 capturable: bool = False, master_weights: bool = False) -> None:
        if amsgrad:
            raise RuntimeError("FusedAdam does not support the AMSGrad variant.")
        _check_extensions("FusedAdam")
        CALLS.append(("FusedAdam", {
            "lr": lr, "bias_correction": bias_correction, "betas": betas, "eps": eps,
            "adam_w_mode": adam_w_mode, "weight_decay": weight_decay, "amsgrad": amsgrad,
            "set_grad_none": set_grad_none, "capturable": capturable, "master_weights": master_weights,
        }))
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                         decoupled_weight_decay=adam_w_mode)
        self.adam_w_mode = 1 if adam_w_mode else 0
        self.set_grad_none = set_grad_none

    def zero_grad(self) -> None:  # type: ignore[override]  # apex's signature: no set_to_none
        """Reset gradients (to None when ``set_grad_none``), as apex does."""
        _zero_grad(self)


class FusedSGD(torch.optim.SGD):
    """apex's FusedSGD (``lr`` is required, as in apex)."""

    def __init__(self, params: Any, lr: Any = required, momentum: float = 0, dampening: float = 0,
                 weight_decay: float = 0, nesterov: bool = False, wd_after_momentum: bool = False,
                 materialize_master_grads: bool = True, set_grad_none: bool = False) -> None:
        if lr is required:
            raise TypeError("FusedSGD() missing required argument: 'lr'")
        _check_extensions("FusedSGD")
        CALLS.append(("FusedSGD", {
            "lr": lr, "momentum": momentum, "dampening": dampening, "weight_decay": weight_decay,
            "nesterov": nesterov, "wd_after_momentum": wd_after_momentum,
            "materialize_master_grads": materialize_master_grads, "set_grad_none": set_grad_none,
        }))
        super().__init__(params, lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                         nesterov=nesterov)
        self.set_grad_none = set_grad_none

    def zero_grad(self) -> None:  # type: ignore[override]
        """Reset gradients (to None when ``set_grad_none``), as apex does."""
        _zero_grad(self)


class FusedLAMB(torch.optim.AdamW):
    """apex's FusedLAMB signature; the update is AdamW's (a stand-in, not LAMB's trust ratio)."""

    def __init__(self, params: Any, lr: float = 1e-3, bias_correction: bool = True,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6, weight_decay: float = 0.01,
                 amsgrad: bool = False, adam_w_mode: bool = True, grad_averaging: bool = True,
                 set_grad_none: bool = True, max_grad_norm: float = 1.0, use_nvlamb: bool = False) -> None:
        if amsgrad:
            raise RuntimeError("FusedLAMB does not support the AMSGrad variant.")
        _check_extensions("FusedLAMB")
        CALLS.append(("FusedLAMB", {
            "lr": lr, "bias_correction": bias_correction, "betas": betas, "eps": eps,
            "weight_decay": weight_decay, "adam_w_mode": adam_w_mode, "grad_averaging": grad_averaging,
            "set_grad_none": set_grad_none, "max_grad_norm": max_grad_norm, "use_nvlamb": use_nvlamb,
        }))
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
        self.set_grad_none = set_grad_none

    def zero_grad(self) -> None:  # type: ignore[override]
        """Reset gradients (to None when ``set_grad_none``), as apex does."""
        _zero_grad(self)
