"""Walking nested batches: apply a function to every tensor in lists, tuples, dicts and namedtuples."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import Any

import torch


def map_tensors(obj: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    """Return ``obj`` with ``fn`` applied to every tensor inside it; other leaves are kept as they are."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuple
        return type(obj)(*(map_tensors(v, fn) for v in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(map_tensors(v, fn) for v in obj)
    if isinstance(obj, Mapping):
        items = {k: map_tensors(v, fn) for k, v in obj.items()}
        if isinstance(obj, defaultdict):  # its constructor takes the default factory first
            return type(obj)(obj.default_factory, items)
        return type(obj)(items)  # type: ignore[call-arg]  # dict-like
    return obj


def move_to(obj: Any, device: torch.device, *, memory_format: torch.memory_format | None = None,
            async_from_host: bool = False) -> Any:
    """Move a module (in place), a tensor or a nested batch to ``device``.

    Tensor copies are non-blocking when the source is in pinned memory, so they overlap with compute.
    ``async_from_host``: copies from host memory are non-blocking whether it is pinned or not. Pass it only for
    a device whose copies from pageable host memory are staged before the call returns, so the host may reuse
    the source at once (CUDA: PyTorch's guide to ``pin_memory`` and ``non_blocking`` says so for CUDA alone);
    the copy then skips the wait for the device's queued work that a blocking copy makes, and nothing asks
    whether the source is pinned.
    """
    if isinstance(obj, torch.nn.Module):
        if memory_format is not None:
            # Module.to takes both at once; torch declares them in separate overloads
            return obj.to(device=device, memory_format=memory_format)  # type: ignore[call-overload]
        return obj.to(device)
    if isinstance(obj, torch.Tensor):
        return _move(obj, device, memory_format, async_from_host)
    kind = type(obj)
    if kind is tuple or kind is list:  # the common (inputs, targets) batch: no general walk, no extra frame
        for t in obj:
            if not isinstance(t, torch.Tensor):
                break
        else:
            moved = []
            for t in obj:
                if memory_format is None and not async_from_host:
                    moved.append(t if t.device == device else t.to(device, non_blocking=t.is_pinned()))
                else:
                    moved.append(_move(t, device, memory_format, async_from_host))
            return moved if kind is list else tuple(moved)
    return map_tensors(obj, lambda t: _move(t, device, memory_format, async_from_host))


def _move(t: torch.Tensor, device: torch.device, memory_format: torch.memory_format | None,
          async_from_host: bool = False) -> torch.Tensor:
    # A tensor already on the device is kept (what .to() would return) without asking whether its memory is
    # pinned, a query that costs more than the rest of the move on a CPU device.
    if t.device == device:
        out = t
    else:
        out = t.to(device, non_blocking=(async_from_host and t.device.type == "cpu") or t.is_pinned())
    if memory_format is not None and out.dim() == 4:
        out = out.contiguous(memory_format=memory_format)
    return out
