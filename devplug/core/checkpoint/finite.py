"""Finding NaN and infinity in many tensors at once (checkpoint saves only, never in the step)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence

import torch


def _max_abs(tensors: list[torch.Tensor]) -> torch.Tensor:
    """The infinity norm of each tensor (NaN where one holds NaN), in one fused launch where torch has it."""
    try:
        norms: Sequence[torch.Tensor] = torch._foreach_norm(tensors, float("inf"))
    except (AttributeError, RuntimeError, NotImplementedError):  # a backend without the foreach kernel
        norms = [torch.linalg.vector_norm(t, float("inf")) for t in tensors]
    return torch.stack(list(norms))


def nonfinite(named: Iterable[tuple[str, torch.Tensor]]) -> list[str]:
    """Names of the floating-point tensors among ``named`` that hold NaN or an infinity.

    One fused reduction per device and dtype, then one read of the flags per device: a host sync, so call
    it where one is due anyway (before writing a checkpoint).
    """
    groups: dict[tuple[torch.device, torch.dtype], list[tuple[str, torch.Tensor]]] = defaultdict(list)
    for name, tensor in named:
        if (tensor.is_floating_point() or tensor.is_complex()) and tensor.numel():
            groups[(tensor.device, tensor.dtype)].append((name, tensor.detach()))
    bad: list[str] = []
    for members in groups.values():
        tensors = [t for _, t in members]
        try:
            finite = torch.isfinite(_max_abs(tensors)).cpu().tolist()
        except (RuntimeError, NotImplementedError):  # a device or dtype without these reductions: host copies
            finite = [_all_finite(t) for t in tensors]
        bad.extend(name for (name, _), ok in zip(members, finite, strict=True) if not ok)
    return bad


def _all_finite(tensor: torch.Tensor) -> bool:
    """True when the host copy of ``tensor`` holds no NaN or infinity (widened where its dtype has no isfinite,
    e.g. ``float8_e4m3fn``)."""
    host = tensor.cpu()
    try:
        return bool(torch.isfinite(host).all())
    except (RuntimeError, NotImplementedError):
        return bool(torch.isfinite(host.to(torch.complex64 if host.is_complex() else torch.float32)).all())
