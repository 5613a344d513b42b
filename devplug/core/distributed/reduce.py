"""The author's collectives: reduce a value and gather per-sample tensors across ranks (evaluation metrics).

Behind ``Trainer.all_reduce`` and ``Trainer.gather``, which are the identity in one process and call these
only when the job has several. Every rank must call them, the same number of times and in the same order:
they are collectives, and a rank that skips one leaves the others waiting.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from devplug.core.distributed.combine import wait_for_release

#: The reductions ``Trainer.all_reduce`` accepts.
REDUCE_OPS = ("sum", "mean", "max", "min")
_TORCH_OPS = {"sum": dist.ReduceOp.SUM, "mean": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX,
              "min": dist.ReduceOp.MIN}


def all_reduce(value: Any, op: str, device: torch.device) -> Any:
    """``value`` reduced over all ranks with ``op`` (a collective); a new tensor, or a number for a number.

    A tensor is reduced where it lives (the device's backend must reach it: the Trainer's device does) and
    is not modified; a Python number travels in a one-element tensor on ``device`` (int64, or float64)
    and comes back a number. ``"mean"`` is the sum divided by the world size.
    """
    number = not isinstance(value, torch.Tensor)
    if number:
        kind = torch.int64 if isinstance(value, (bool, int)) else torch.float64
        tensor = torch.tensor(value, dtype=kind, device=device)
    else:
        tensor = value.detach().clone()
    dist.all_reduce(tensor, op=_TORCH_OPS[op])
    _released(tensor)
    if op == "mean":
        tensor = tensor / dist.get_world_size()
    return tensor.item() if number else tensor


def gather(tensor: torch.Tensor) -> torch.Tensor:
    """Every rank's ``tensor`` concatenated along the first dimension, in rank order (a collective).

    Ranks may hold different numbers of rows (an evaluation loader's uneven shards), even none; the
    other dimensions and the dtype must agree. A 0-dimensional tensor counts as one row. Each rank gets
    the whole result.
    """
    rows = tensor.detach().reshape(1) if tensor.dim() == 0 else tensor.detach().contiguous()
    world = dist.get_world_size()
    size = torch.tensor([rows.shape[0]], dtype=torch.int64, device=rows.device)
    sizes = [torch.empty_like(size) for _ in range(world)]
    dist.all_gather(sizes, size)
    counts = [int(s.item()) for s in sizes]
    padded = rows.new_zeros((max(counts), *rows.shape[1:]))
    padded[: rows.shape[0]] = rows
    parts = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded)
    for done in (size, *sizes, padded, *parts):
        _released(done)
    return torch.cat([part[:count] for part, count in zip(parts, counts, strict=True)])


def _released(tensor: torch.Tensor) -> None:
    if dist.get_backend() == "gloo":
        wait_for_release(tensor)  # gloo lets go of a collective's tensors a moment later (see combine.py)
