"""Gradient clipping on Gaudi: ``hpex.normalization.FusedClipNorm``, one fused kernel for the total L2 norm.

Used for ``norm_type=2.0`` when the Intel Gaudi stack provides it; other norms, or a stack without it,
fall back to torch's ``clip_grad_norm_`` (the core's fallback), saying why once. A ``FusedClipNorm``
keeps ``max_norm`` as a device tensor, so one is built per ``(max_norm, dtype)`` and reused every step.
"""

from __future__ import annotations

import importlib
import logging

import torch

from devplug import Device
from devplug.plugins.hpu import runtime

HPEX_NORMALIZATION = "habana_frameworks.torch.hpex.normalization"


def clip_grad_norm(device: Device, parameters: list[torch.Tensor], max_norm: float,
                   norm_type: float) -> torch.Tensor | None:
    """The total norm after ``FusedClipNorm`` clipped ``parameters``' gradients; ``None`` to defer to torch."""
    if norm_type != 2.0:
        runtime.log_once(f"gradient clipping: FusedClipNorm computes the L2 norm only, not norm_type={norm_type}; "
                         "using torch.nn.utils.clip_grad_norm_")
        return None
    if not parameters:
        return None
    if any(hasattr(p.grad, "placements") for p in parameters):
        runtime.log_once("gradient clipping: the gradients are sharded (FSDP); FusedClipNorm would see this card's "
                         "shard only, so torch.nn.utils.clip_grad_norm_ computes the norm across ranks")
        return None
    try:
        fused = importlib.import_module(HPEX_NORMALIZATION).FusedClipNorm
    except (ImportError, AttributeError) as exc:
        runtime.log_once(f"gradient clipping: {HPEX_NORMALIZATION}.FusedClipNorm is not available "
                         f"({type(exc).__name__}: {exc}); using torch.nn.utils.clip_grad_norm_", logging.WARNING)
        return None
    key = (float(max_norm), parameters[0].dtype)
    clippers = runtime.state().clippers
    if key not in clippers:
        clippers[key] = fused(parameters, max_norm)
    return clippers[key].clip_norm(parameters)
