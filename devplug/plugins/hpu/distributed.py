"""Joining a multi-card job on Gaudi: HCCL, the launcher's ranks as Habana reads them, DDP defaults.

Importing ``habana_frameworks.torch.distributed.hccl`` registers the ``hccl`` backend with
``torch.distributed``. ``initialize_distributed_hpu()`` reads rank, world size and local rank from
torchrun's or mpirun's variables (copying mpirun's to torchrun's names and defaulting ``MASTER_ADDR``/
``MASTER_PORT``), returns ``(world_size, rank, local_rank)`` and points this process at its own card;
recent releases also accept the three values as arguments.

DDP defaults follow Habana's reference scripts and performance guide: a larger gradient bucket
(``bucket_cap_mb``, 100 MB as for ResNet-50; the ``bucket_cap_mb`` option tunes it per model),
gradients as views of the buckets (fewer device copies), no buffer broadcast every step, and no
``device_ids`` (one card per process, chosen by the runtime).
"""

from __future__ import annotations

import importlib
import inspect
import logging
from collections.abc import Callable
from typing import Any

from devplug import CollectiveSetup, ConfigError, Device, LaunchInfo
from devplug.plugins.hpu import runtime

HCCL_MODULE = "habana_frameworks.torch.distributed.hccl"
DEFAULT_BUCKET_CAP_MB = 100


def _accepts_overrides(initialize: Callable[..., Any]) -> bool:
    try:
        return {"world_size", "rank", "local_rank"} <= set(inspect.signature(initialize).parameters)
    except (TypeError, ValueError):
        return False


def collective_setup(device: Device, launch: LaunchInfo) -> CollectiveSetup:
    """Import HCCL, let Habana read the launch, and return the ``hccl`` backend with Gaudi's DDP defaults.

    Habana reads torchrun's and mpirun's variables itself; its reading must agree with devplug's, else
    this raises `ConfigError` (the job would deadlock or shard data wrongly). For launchers it
    does not read (SLURM's srun), devplug's reading is handed to it where the release accepts
    ``initialize_distributed_hpu(world_size, rank, local_rank)``, so it still selects this rank's card.
    """
    hccl = importlib.import_module(HCCL_MODULE)
    initialize = hccl.initialize_distributed_hpu
    world_size, rank, local_rank = initialize()
    expected = (launch.world_size, launch.rank, launch.local_rank)
    if (world_size <= 1 or rank < 0) and launch.distributed and _accepts_overrides(initialize):
        world_size, rank, local_rank = initialize(
            world_size=launch.world_size, rank=launch.rank, local_rank=launch.local_rank
        )
    init_kwargs: dict[str, int] = {}
    if world_size > 1 and rank >= 0:
        if (world_size, rank, local_rank) != expected:
            raise ConfigError(
                f"Habana's initialize_distributed_hpu() sees world_size, rank, local_rank = "
                f"{(world_size, rank, local_rank)} but the {launch.launcher} launch says {expected}; launch with "
                "torchrun, mpirun or srun and do not set RANK/WORLD_SIZE/LOCAL_RANK by hand"
            )
        init_kwargs = {"rank": rank, "world_size": world_size}
    else:
        runtime.log_once(
            f"initialize_distributed_hpu() cannot read this {launch.launcher} launch (rank {launch.rank} of "
            f"{launch.world_size}); the Gaudi runtime chooses the card",
            logging.WARNING,
        )
    return CollectiveSetup(
        backend="hccl",
        ddp_kwargs={
            "bucket_cap_mb": int(device.options.get("bucket_cap_mb", DEFAULT_BUCKET_CAP_MB)),
            "gradient_as_bucket_view": True,
            "broadcast_buffers": False,
        },
        init_kwargs=init_kwargs,
    )
