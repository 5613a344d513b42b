"""Values combined across ranks outside the step: metrics at log points, stop flags at step boundaries.

Nothing here runs in the steady-state step. Over gloo, each reduction waits until the collective's worker
thread has let go of its tensor (:func:`wait_for_release`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
import torch.distributed as dist


def mean_across_ranks(values: torch.Tensor) -> torch.Tensor:
    """Average a tensor of metrics over all ranks (called at log points only, never in the step)."""
    values = values.clone()
    dist.all_reduce(values, op=dist.ReduceOp.SUM)
    if dist.get_backend() == "gloo":
        wait_for_release(values)
    return values / dist.get_world_size()


def wait_for_release(tensor: torch.Tensor, timeout: float = 2.0) -> bool:
    """Wait until a finished collective's worker thread has let go of ``tensor``; False on timeout.

    gloo's worker threads drop their reference to a collective's tensors a moment *after* the caller
    sees it complete, and dropping a tensor Python also knows takes the GIL; during interpreter
    shutdown that aborts the process (see :func:`register_exit_grace`). Waiting for the reference count
    to fall back to the caller's own reference (microseconds, at log points only) makes the release of
    devplug's own metric reduction certain rather than likely.
    """
    deadline = time.monotonic() + timeout
    while tensor._use_count() > 1:  # type: ignore[attr-defined]  # private, and absent from torch's stubs
        if time.monotonic() > deadline:
            return False
        time.sleep(0.0002)  # releases the GIL, which the worker thread needs
    return True


def gloo_combine() -> Callable[[bool], bool]:
    """A function that ORs a flag across all ranks over a CPU ``gloo`` group (created now, collectively)."""
    group = dist.new_group(backend="gloo")

    def combine(flag: bool) -> bool:
        value = torch.tensor([1 if flag else 0], dtype=torch.int32)
        # new_group answers NON_GROUP_MEMBER only to a rank outside the group, and this group has every rank
        dist.all_reduce(value, op=dist.ReduceOp.MAX, group=group)  # type: ignore[arg-type]
        wait_for_release(value)  # gloo lets go of the tensor a moment later (see register_exit_grace)
        return bool(value.item())

    return combine
