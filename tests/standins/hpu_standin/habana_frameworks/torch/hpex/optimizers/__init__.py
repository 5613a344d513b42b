"""Stand-in for ``habana_frameworks.torch.hpex.optimizers``: ``FusedAdamW`` and ``FusedSGD``.

Mirrors HabanaAI/gaudi-pytorch-bridge release 1.19 (commit 5a56187),
``python_packages/habana_frameworks/torch/hpex/optimizers/FusedAdamW.py`` and ``FusedSGD.py``: signatures
and defaults (note ``FusedAdamW``'s ``eps=1e-6`` and ``weight_decay=0.0``, which differ from
``torch.optim.AdamW``'s), the ``param_groups`` keys and the state layout:

- ``FusedAdamW``: ``defaults = dict(lr, betas, eps, weight_decay, bias_correction)``; the step count is
  per *group*, ``group["step"]`` (an ``int`` incremented on each step of a group with gradients); per
  parameter ``{"step": 0, "exp_avg", "exp_avg_sq"}`` in the parameter's dtype, the per-parameter
  ``step`` set once and never advanced (FusedAdamW.py lines 28-58, 103-110, 126-131). Update:
  ``w *= 1 - weight_decay * lr``, then ``w -= lr * sqrt(bc2) / bc1 * exp_avg / (sqrt(exp_avg_sq) + eps)``
  (lines 133-165: the step size carries the bias corrections and ``eps`` goes to the kernel as given, so
  unlike torch's AdamW, ``eps`` is not scaled by ``sqrt(bc2)``). ``moments_dtype`` (a dtype or a pair)
  sets the moments' dtypes, the parameter's by default (lines 36, 58, 201-207). In lazy mode the step
  marks the graph itself, before each group and after the update (lines 61-69, 85); the stand-in
  records that as ``FusedAdamW.mark_step_if_lazy``, apart from the plugin's own ``mark_step``.
- ``FusedSGD``: ``defaults = dict(lr, momentum, weight_decay, dampening, nesterov)``; per parameter
  ``{"momentum_buffer"}`` in float32 (the real one creates ``torch.zeros(grad.shape)``), only with
  momentum. The real kernel also takes ``self.step_t``, a counter kept outside the state dict, whose use
  is not documented; the stand-in seeds a new buffer with the gradient on its first step, as torch does.

The update rules are computed with plain torch ops on whatever device the parameters are on; every
construction and step is recorded.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import hpu_standin_calls
import torch
from torch.optim import Optimizer
from torch.optim.optimizer import required


class FusedAdamW(Optimizer):
    """AdamW with decoupled weight decay, all parameters of a group updated by one fused kernel (FusedAdamW.py
    lines 27-58)."""

    def __init__(
        self,
        params: Iterable[torch.nn.parameter.Parameter],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        bias_correction: bool = True,
        moments_dtype: torch.dtype | tuple[torch.dtype, torch.dtype] | None = None,
    ) -> None:
        if lr < 0.0:
            raise ValueError(f"Invalid learning rate: {lr} - should be >= 0.0")
        if not 0.0 <= betas[0] < 1.0 or not 0.0 <= betas[1] < 1.0:
            raise ValueError(f"Invalid beta parameter: {betas} - should be in [0.0, 1.0[")
        if not 0.0 <= eps:
            raise ValueError(f"Invalid epsilon value: {eps} - should be >= 0.0")
        hpu_standin_calls.record(
            "FusedAdamW", lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
            bias_correction=bias_correction, **({} if moments_dtype is None else {"moments_dtype": moments_dtype}),
        )
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, bias_correction=bias_correction)
        super().__init__(params, defaults)
        self.moments_dtype = moments_dtype

    def get_moment_dtypes(self, param_dtype: torch.dtype) -> tuple[torch.dtype, torch.dtype]:
        """The dtypes of ``exp_avg`` and ``exp_avg_sq`` (FusedAdamW.py lines 201-207)."""
        if self.moments_dtype is None:
            return param_dtype, param_dtype
        if isinstance(self.moments_dtype, tuple):
            return self.moments_dtype
        return self.moments_dtype, self.moments_dtype

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One optimization step over every parameter group (FusedAdamW.py lines 69-189)."""
        from habana_frameworks.torch.utils.internal import is_lazy

        hpu_standin_calls.record("FusedAdamW.step")
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            if is_lazy():  # htcore.step_closure._mark_step_if_lazy() before each group (line 85)
                hpu_standin_calls.record("FusedAdamW.mark_step_if_lazy")
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            group["step"] = group.get("step", 0) + 1
            beta1, beta2 = group["betas"]
            step_size = group["lr"]
            if group["bias_correction"]:
                step_size *= math.sqrt(1.0 - beta2 ** group["step"]) / (1.0 - beta1 ** group["step"])
            for p in params:
                state = self.state[p]
                if len(state) == 0:
                    state["step"] = 0
                    avg_dtype, avg_sq_dtype = self.get_moment_dtypes(p.dtype)
                    state["exp_avg"] = torch.zeros(p.shape, dtype=avg_dtype).to(p.device)
                    state["exp_avg_sq"] = torch.zeros(p.shape, dtype=avg_sq_dtype).to(p.device)
                exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                grad = p.grad.to(exp_avg.dtype)
                exp_avg.mul_(beta1).add_(grad, alpha=1.0 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1.0 - beta2)
                p.mul_(1.0 - group["weight_decay"] * group["lr"])
                p.addcdiv_(exp_avg.to(p.dtype), exp_avg_sq.to(p.dtype).sqrt().add_(group["eps"]), value=-step_size)
        if is_lazy():  # step_wrap: _mark_step_if_lazy() after the step (lines 61-69)
            hpu_standin_calls.record("FusedAdamW.mark_step_if_lazy")
        return loss


class FusedSGD(Optimizer):
    """SGD with momentum, all parameters of a group updated by one fused kernel (HabanaAI/gaudi-pytorch-bridge
    1.19, python_packages/habana_frameworks/torch/hpex/optimizers/
    FusedSGD.py lines 31-73)."""

    def __init__(
        self,
        params: Iterable[torch.nn.parameter.Parameter],
        lr: float = required,
        momentum: float = 0,
        weight_decay: float = 0,
        dampening: float = 0,
        nesterov: bool = False,
    ) -> None:
        if lr is required or lr < 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        hpu_standin_calls.record(
            "FusedSGD", lr=lr, momentum=momentum, weight_decay=weight_decay, dampening=dampening, nesterov=nesterov
        )
        defaults = dict(lr=lr, momentum=momentum, weight_decay=weight_decay, dampening=dampening, nesterov=nesterov)
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One optimization step over every parameter group (FusedSGD.py lines 78-170; buffers lines 144-146)."""
        hpu_standin_calls.record("FusedSGD.step")
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                d_p = p.grad.add(p, alpha=group["weight_decay"]) if group["weight_decay"] else p.grad
                if group["momentum"]:
                    state = self.state[p]
                    if "momentum_buffer" not in state:
                        state["momentum_buffer"] = d_p.float().clone()
                    else:
                        state["momentum_buffer"].mul_(group["momentum"]).add_(d_p, alpha=1 - group["dampening"])
                    buf = state["momentum_buffer"]
                    d_p = d_p.add(buf, alpha=group["momentum"]) if group["nesterov"] else buf
                p.add_(d_p, alpha=-group["lr"])
        return loss
