"""Joining a process group and wrapping modules in DistributedDataParallel, as the device plugin says.

Only imported when the launcher reports more than one process.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from devplug.core.records import CollectiveSetup

if TYPE_CHECKING:
    from devplug.core.trainer import Trainer

log = logging.getLogger("devplug")


def init_process_group(trainer: Trainer) -> CollectiveSetup:
    """Ask the device plugin for its collective setup and join the default process group."""
    launch = trainer.launch
    setup = trainer.hooks.devplug_collective_setup(launch=launch)
    if not dist.is_initialized():
        kwargs: dict[str, Any] = {
            "backend": setup.backend,
            "rank": launch.rank,
            "world_size": launch.world_size,
            "init_method": f"tcp://{launch.master_addr}:{launch.master_port}"
            if launch.launcher != "torchrun"
            else "env://",
            "timeout": timedelta(minutes=10),
        }
        kwargs.update(setup.init_kwargs)
        dist.init_process_group(**kwargs)
    log.info("rank %d/%d joined process group (%s, %s)", launch.rank, launch.world_size, setup.backend,
             launch.launcher)
    return setup


def wrap_ddp(trainer: Trainer, module: torch.nn.Module) -> DistributedDataParallel:
    """Wrap ``module`` in DDP with the plugin's defaults overridden by the author's options."""
    assert trainer.collective is not None
    kwargs = dict(trainer.collective.ddp_kwargs)
    kwargs.update(trainer.config.ddp_overrides())
    return DistributedDataParallel(module, **kwargs)


def mean_across_ranks(values: torch.Tensor) -> torch.Tensor:
    """Average a tensor of metrics over all ranks (called at log points only)."""
    values = values.clone()
    dist.all_reduce(values, op=dist.ReduceOp.SUM)
    return values / dist.get_world_size()
