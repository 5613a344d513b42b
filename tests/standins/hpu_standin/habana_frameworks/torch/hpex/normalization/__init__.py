"""Stand-in for ``habana_frameworks.torch.hpex.normalization``: ``FusedClipNorm``.

Mirrors the API of Intel Gaudi's ``FusedClipNorm`` (HabanaAI/gaudi-pytorch-bridge,
``python_packages/habana_frameworks/torch/hpex/normalization/FusedClipNorm.py``): the constructor takes
the parameters (only their dtype is used) and ``max_norm``, the norm is always the L2 norm, and
``clip_norm(parameters)`` scales every gradient in place so the total norm is at most ``max_norm`` and
returns the total norm before clipping (``tensor(0.0)`` when no parameter has a gradient). The real
kernel runs on the device; the stand-in computes the same result with torch ops where the gradients
are and records every construction and call.
"""

from __future__ import annotations

from collections.abc import Iterable

import hpu_standin_calls
import torch


class FusedClipNorm:
    """(HabanaAI/gaudi-pytorch-bridge 1.19, python_packages/habana_frameworks/torch/hpex/normalization/
    FusedClipNorm.py lines 27-37) Clip gradients to a total L2 norm of ``max_norm`` with one fused kernel."""

    def __init__(self, parameters: Iterable[torch.nn.parameter.Parameter], max_norm: float) -> None:
        params = list(parameters)
        self.dtype = params[0].dtype if params else torch.float32
        self.max_norm_t = torch.ones(1) * max_norm
        self.norm_type = 2.0
        hpu_standin_calls.record("FusedClipNorm", max_norm=float(max_norm))

    def clip_norm(self, parameters: torch.Tensor | Iterable[torch.Tensor]) -> torch.Tensor:
        """Clip the gradients of ``parameters`` in place; the total norm before clipping (FusedClipNorm.py line 37)."""
        if isinstance(parameters, torch.Tensor):
            grads = [parameters.grad] if parameters.grad is not None else []
        else:
            grads = [p.grad for p in parameters if p.grad is not None]
        hpu_standin_calls.record("FusedClipNorm.clip_norm", tensors=len(grads))
        if not grads:
            return torch.tensor(0.0)
        with torch.no_grad():
            total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads]))
            scale = torch.clamp(self.max_norm_t.to(total.device) / (total + 1e-6), max=1.0)
            for g in grads:
                g.mul_(scale.to(g.dtype))
        return total
