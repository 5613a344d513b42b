"""Stand-in for NVIDIA apex's ``apex.optimizers`` (tests only, never shipped).

Mirrors NVIDIA/apex ``apex/optimizers/fused_adam.py``, ``fused_sgd.py`` and ``fused_lamb.py``: the
constructor signatures, the ``param_groups`` keys (``defaults``), the state layout and the update rules,
computed with plain torch ops on whatever device the parameters are on:

- ``FusedAdam``: ``defaults = dict(lr, bias_correction, betas, eps, weight_decay)``; ``self.adam_w_mode``
  (1: decoupled weight decay, 0: L2); the step count is per *group*, ``group["step"]`` (an ``int``
  incremented on every ``step()``, a device tensor when ``capturable``); per-parameter state
  ``{"exp_avg", "exp_avg_sq"}`` in float32. Update as ``csrc/multi_tensor_adam.cu``: ``m/bc1 /
  (sqrt(v/bc2) + eps)``, plus ``weight_decay * p`` in the update (AdamW mode) or in the gradient (L2).
- ``FusedSGD``: ``defaults = dict(lr, momentum, dampening, weight_decay, nesterov)``; per-parameter
  ``{"momentum_buffer"}`` created (zero) on the first step even without momentum; ``first_run`` (no
  buffer yet) seeds the buffer with the gradient, as ``csrc/multi_tensor_sgd_kernel.cu`` does.
- ``FusedLAMB``: ``defaults = dict(lr, bias_correction, betas, eps, weight_decay, grad_averaging,
  max_grad_norm)``; ``group["step"]``; per-parameter ``{"exp_avg", "exp_avg_sq"}``; LAMB's per-tensor
  trust ratio ``||p|| / ||update||`` (``csrc/multi_tensor_lamb.cu``).

``zero_grad(self)`` has no ``set_to_none`` argument, as in apex. Each construction appends
``(class name, keyword arguments)`` to `CALLS`; ``CUDA_EXTENSIONS = False`` mimics an apex built
without its CUDA extensions, whose constructors raise as apex's do.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch.optim.optimizer import required

#: Constructor calls: ``(class name, {argument: value})`` without ``params``.
CALLS: list[tuple[str, dict[str, Any]]] = []
#: The gradients FusedAdam applied, after its own unscaling (one tensor per parameter and step).
STEPS: list[torch.Tensor] = []

#: False mimics apex installed without ``--cuda_ext`` (its fused optimizers refuse to build).
CUDA_EXTENSIONS = True


def _check_extensions(name: str) -> None:
    """apex without its CUDA extensions refuses to build (NVIDIA/apex 6424da3b, apex/optimizers/fused_adam.py
    line 136, fused_sgd.py line 122, fused_lamb.py line 100)."""
    if not CUDA_EXTENSIONS:
        raise RuntimeError(f"apex.optimizers.{name} requires cuda extensions")


class _ApexOptimizer(torch.optim.Optimizer):
    """What apex's fused optimizers share: ``zero_grad(self)`` without ``set_to_none`` (fused_adam.py lines 138-144)."""

    set_grad_none: bool

    def zero_grad(self) -> None:  # type: ignore[override]  # apex's signature: no set_to_none
        """Reset gradients (to None when ``set_grad_none``), as apex does (fused_adam.py lines 138-144)."""
        if self.set_grad_none:
            for group in self.param_groups:
                for param in group["params"]:
                    param.grad = None
        else:
            torch.optim.Optimizer.zero_grad(self)  # as apex: super().zero_grad()


def _next_step(group: dict[str, Any], capturable: bool, device: torch.device) -> int:
    """apex's per-group step count: incremented on every step (fused_adam.py lines 180-187, fused_lamb.py
    lines 169-172)."""
    if "step" in group:
        group["step"] += 1
    else:
        group["step"] = torch.tensor([1], dtype=torch.int, device=device) if capturable else 1
    step = group["step"]
    return int(step.item()) if isinstance(step, torch.Tensor) else step


class FusedAdam(_ApexOptimizer):
    """apex's FusedAdam: Adam, or AdamW with ``adam_w_mode=True`` (apex's default).

    NVIDIA/apex at commit 6424da3b (master, 2025), ``apex/optimizers/fused_adam.py``:

    - lines 82-87: ``amsgrad`` refused; ``master_weights=True`` without ``capturable=True`` refused
      ("Master weights is currently only supported with the capturable version.");
    - lines 88-89 and 117-125: a capturable optimizer's ``lr`` is a float32 tensor on the parameters'
      device, and ``_step_supports_amp_scaling = True`` (torch's GradScaler then passes itself to
      ``step(grad_scaler=...)`` instead of unscaling);
    - lines 146-154: ``step(closure, grads, output_params, scale, grad_norms, grad_scaler)``;
    - lines 180-187: the per-group step count (an int, or an int tensor advanced unless the last step
      overflowed when capturable);
    - lines 234-252: capturable: ``found_inf`` from ``grad_scaler._check_inf_per_device(self)[device]``
      and ``inv_scale = 1 / grad_scaler._get_scale_async()`` (ones without a scaler), whatever the
      scaler's stage: gradients the scaler already unscaled are divided by the scale a second time;
    - ``csrc/amp_C_frontend.cpp`` lines 44-48: ``multi_tensor_adam_capturable`` takes ``at::Tensor lr``,
      so a Python float ``lr`` is a TypeError from its binding.
    """

    def __init__(self, params: Any, lr: float = 1e-3, bias_correction: bool = True,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, adam_w_mode: bool = True,
                 weight_decay: float = 0.0, amsgrad: bool = False, set_grad_none: bool = True,
                 capturable: bool = False, master_weights: bool = False) -> None:
        if amsgrad:
            raise RuntimeError("FusedAdam does not support the AMSGrad variant.")
        if master_weights and not capturable:
            raise RuntimeError("Master weights is currently only supported with the capturable version.")
        CALLS.append(("FusedAdam", {
            "lr": lr, "bias_correction": bias_correction, "betas": betas, "eps": eps,
            "adam_w_mode": adam_w_mode, "weight_decay": weight_decay, "amsgrad": amsgrad,
            "set_grad_none": set_grad_none, "capturable": capturable, "master_weights": master_weights,
        }))
        lr = torch.tensor(lr, dtype=torch.float32) if capturable else lr  # type: ignore[assignment]
        defaults = dict(lr=lr, bias_correction=bias_correction, betas=betas, eps=eps, weight_decay=weight_decay)
        super().__init__(params, defaults)
        self.adam_w_mode = 1 if adam_w_mode else 0
        self.set_grad_none = set_grad_none
        self.capturable = capturable
        self.master_weights = master_weights
        if capturable:
            for group in self.param_groups:
                if group["params"]:
                    group["lr"] = group["lr"].to(device=group["params"][0].device)
            self._step_supports_amp_scaling = True
        self._dummy_overflow_buf = torch.zeros(1, dtype=torch.int)
        _check_extensions("FusedAdam")

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None, grads: Any = None, output_params: Any = None,
             scale: Any = None, grad_norms: Any = None, grad_scaler: Any = None) -> Any:
        """One step over every group (fused_adam.py lines 146-300; the step counted per group, even without
        gradients)."""
        if any(p is not None for p in (grads, output_params, scale, grad_norms)):
            raise RuntimeError("FusedAdam has been updated.  Simply initialize it identically to torch.optim.Adam, "
                               "and call step() with no arguments.")
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            if not group["params"]:
                continue
            device = group["params"][0].device
            if self.capturable:
                if "step" in group:
                    group["step"] += (self._dummy_overflow_buf != 1).to(torch.int).to(device)
                else:
                    group["step"] = torch.tensor([1], dtype=torch.int, device=device)
                step = int(group["step"].item())
            else:
                step = _next_step(group, False, device)
            inv_scale = 1.0
            if self.capturable:
                found_inf = (grad_scaler._check_inf_per_device(self)[device] if grad_scaler is not None
                             else torch.zeros((1,), device=device))
                self._dummy_overflow_buf.copy_(found_inf)
                if grad_scaler is not None:
                    inv_scale = float(grad_scaler._get_scale_async().double().reciprocal().float())
                if not isinstance(group["lr"], torch.Tensor):
                    raise TypeError("multi_tensor_adam_capturable(): incompatible function arguments: lr must be "
                                    f"a Tensor, got {type(group['lr']).__name__}")
                if float(found_inf.sum()) != 0:  # the kernel's noop flag: nothing is updated
                    continue
            lr = float(group["lr"])
            beta1, beta2 = group["betas"]
            bc1 = 1 - beta1 ** step if group["bias_correction"] else 1.0
            bc2 = 1 - beta2 ** step if group["bias_correction"] else 1.0
            decay = group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if len(state) == 0:
                    state["exp_avg"] = torch.zeros_like(p).float()
                    state["exp_avg_sq"] = torch.zeros_like(p).float()
                m, v = state["exp_avg"], state["exp_avg_sq"]
                grad, weight = p.grad.float() * inv_scale, p.float()
                STEPS.append(grad.clone())
                if not self.adam_w_mode:
                    grad = grad + decay * weight
                m.mul_(beta1).add_(grad, alpha=1 - beta1)
                v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                update = (m / bc1) / ((v / bc2).sqrt() + group["eps"])
                if self.adam_w_mode:
                    update = update + decay * weight
                p.copy_(weight - lr * update)
        return loss


class FusedSGD(_ApexOptimizer):
    """apex's FusedSGD (``lr`` is required, as in apex: NVIDIA/apex 6424da3b, apex/optimizers/fused_sgd.py lines
    7-122)."""

    def __init__(self, params: Any, lr: Any = required, momentum: float = 0, dampening: float = 0,
                 weight_decay: float = 0, nesterov: bool = False, wd_after_momentum: bool = False,
                 materialize_master_grads: bool = True, set_grad_none: bool = False) -> None:
        if lr is required:
            raise TypeError("FusedSGD() missing required argument: 'lr'")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        CALLS.append(("FusedSGD", {
            "lr": lr, "momentum": momentum, "dampening": dampening, "weight_decay": weight_decay,
            "nesterov": nesterov, "wd_after_momentum": wd_after_momentum,
            "materialize_master_grads": materialize_master_grads, "set_grad_none": set_grad_none,
        }))
        defaults = dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay, nesterov=nesterov)
        super().__init__(params, defaults)
        self.wd_after_momentum = wd_after_momentum
        self.materialize_master_grads = materialize_master_grads
        self.set_grad_none = set_grad_none
        _check_extensions("FusedSGD")

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One step over every group; a first step seeds the momentum buffer with the gradient (fused_sgd.py lines
        137-151, 154-)."""
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            decay, momentum, dampening = group["weight_decay"], group["momentum"], group["dampening"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                first_run = "momentum_buffer" not in state
                if first_run:
                    state["momentum_buffer"] = torch.zeros_like(p)
                buf, grad = state["momentum_buffer"], p.grad
                if decay and not self.wd_after_momentum:
                    grad = grad + decay * p
                if momentum:
                    if first_run:
                        buf.copy_(grad)
                    else:
                        buf.mul_(momentum).add_(grad, alpha=1 - dampening)
                    grad = grad + momentum * buf if group["nesterov"] else buf
                if decay and self.wd_after_momentum:
                    grad = grad + decay * p
                p.add_(grad, alpha=-group["lr"])
        return loss


class FusedLAMB(_ApexOptimizer):
    """apex's FusedLAMB: Adam moments, a global gradient-norm clip, LAMB's trust ratio (NVIDIA/apex 6424da3b,
    apex/optimizers/fused_lamb.py
    lines 5-100)."""

    def __init__(self, params: Any, lr: float = 1e-3, bias_correction: bool = True,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6, weight_decay: float = 0.01,
                 amsgrad: bool = False, adam_w_mode: bool = True, grad_averaging: bool = True,
                 set_grad_none: bool = True, max_grad_norm: float = 1.0, use_nvlamb: bool = False) -> None:
        if amsgrad:
            raise RuntimeError("FusedLAMB does not support the AMSGrad variant.")
        CALLS.append(("FusedLAMB", {
            "lr": lr, "bias_correction": bias_correction, "betas": betas, "eps": eps,
            "weight_decay": weight_decay, "adam_w_mode": adam_w_mode, "grad_averaging": grad_averaging,
            "set_grad_none": set_grad_none, "max_grad_norm": max_grad_norm, "use_nvlamb": use_nvlamb,
        }))
        defaults = dict(lr=lr, bias_correction=bias_correction, betas=betas, eps=eps, weight_decay=weight_decay,
                        grad_averaging=grad_averaging, max_grad_norm=max_grad_norm)
        super().__init__(params, defaults)
        self.adam_w_mode = 1 if adam_w_mode else 0
        self.set_grad_none = set_grad_none
        self.use_nvlamb = use_nvlamb
        _check_extensions("FusedLAMB")

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One LAMB step over every group (fused_lamb.py lines 114-240)."""
        loss = closure() if closure is not None else None
        grads = [p.grad.float() for g in self.param_groups for p in g["params"] if p.grad is not None]
        global_norm = math.sqrt(sum(float(g.pow(2).sum()) for g in grads)) if grads else 0.0
        clip = max(global_norm / self.defaults["max_grad_norm"], 1.0)
        for group in self.param_groups:
            step = _next_step(group, False, group["params"][0].device)
            beta1, beta2 = group["betas"]
            beta3 = 1 - beta1 if group["grad_averaging"] else 1.0
            bc1 = 1 - beta1 ** step if group["bias_correction"] else 1.0
            bc2 = 1 - beta2 ** step if group["bias_correction"] else 1.0
            decay = group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if len(state) == 0:
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                m, v = state["exp_avg"], state["exp_avg_sq"]
                grad = p.grad / clip
                if not self.adam_w_mode:
                    grad = grad + decay * p
                m.mul_(beta1).add_(grad, alpha=beta3)
                v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                update = (m / bc1) / ((v / bc2).sqrt() + group["eps"])
                if self.adam_w_mode:
                    update = update + decay * p
                p_norm, u_norm = float(p.norm()), float(update.norm())
                ratio = p_norm / u_norm if (decay != 0 or self.use_nvlamb) and p_norm > 0 and u_norm > 0 else 1.0
                p.add_(update, alpha=-group["lr"] * ratio)
        return loss
