"""Values combined across ranks outside the step: metrics at log points, stop flags at step boundaries.

Nothing here runs in the steady-state step. Over gloo, each reduction waits until the collective's worker
thread has let go of its tensor (`wait_for_release`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from devplug.core.validators import seconds_from_environment


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
    shutdown that aborts the process (see `register_exit_grace`). Waiting for the reference count
    to fall back to the caller's own reference (microseconds, at log points only) makes the release of
    devplug's own metric reduction certain rather than likely.
    """
    deadline = time.monotonic() + timeout
    while tensor._use_count() > 1:  # type: ignore[attr-defined]  # private, and absent from torch's stubs
        if time.monotonic() > deadline:
            return False
        time.sleep(0.0002)  # releases the GIL, which the worker thread needs
    return True


#: How long a rank waits at an explicit collective (``flush_logs``) for the others before it fails, in seconds.
COLLECTIVE_WAIT_VARIABLE = "DEVPLUG_COLLECTIVE_WAIT"
DEFAULT_COLLECTIVE_WAIT = 120.0


def collective_wait_seconds(environ: Mapping[str, str] | None = None) -> float:
    """``$DEVPLUG_COLLECTIVE_WAIT`` seconds, else 120: how long a rank waits for the others at ``flush_logs``.

    A value that is not a positive number of seconds is a `ConfigError` naming it, as for devplug's other
    variables (never silently the default).
    """
    return seconds_from_environment(COLLECTIVE_WAIT_VARIABLE, DEFAULT_COLLECTIVE_WAIT, environ)


class RankCombiner:
    """Small values combined across all ranks over a CPU ``gloo`` group of their own (created now, collectively).

    Used at step boundaries and log points only. The group has its own timeout, so a rank that waits for
    others that never come fails after ``timeout`` rather than the process group's ten minutes.
    """

    def __init__(self, timeout: timedelta | None = None) -> None:
        group = dist.new_group(backend="gloo", timeout=timeout) if timeout else dist.new_group(backend="gloo")
        assert isinstance(group, dist.ProcessGroup)  # every rank is a member (others would get a marker value)
        self.group = group

    def max(self, value: int) -> int:
        """The largest of every rank's ``value``."""
        tensor = torch.tensor([int(value)], dtype=torch.int64)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=self.group)
        wait_for_release(tensor)  # gloo lets go of the tensor a moment later (see register_exit_grace)
        return int(tensor.item())

    def broadcast(self, value: Any, source: int) -> Any:
        """Rank ``source``'s ``value`` (any picklable object), on every rank."""
        box = [value]
        dist.broadcast_object_list(box, src=source, group=self.group)
        return box[0]
