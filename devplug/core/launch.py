"""Reading where this process sits in a job from the launcher's environment.

torchrun / torch elastic, SLURM's srun and Open MPI's mpirun each describe rank and world size in
their own variables; :func:`detect_launch` turns any of them into one :class:`LaunchInfo`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from devplug.core.errors import ConfigError
from devplug.core.records import LaunchInfo

DEFAULT_PORT = 29500


def _int(env: Mapping[str, str], name: str) -> int:
    try:
        return int(env[name])
    except ValueError:
        raise ConfigError(f"environment variable {name}={env[name]!r} is not an integer") from None


def first_slurm_host(nodelist: str) -> str:
    """The first host of a SLURM node list: ``"node[03-05,07],gpu1"`` → ``"node03"``."""
    head = re.match(r"([^,\[]+)(\[([^\]]+)\])?", nodelist.strip())
    if head is None:
        return "127.0.0.1"
    prefix, _, ranges = head.groups()
    if not ranges:
        return prefix
    first = ranges.split(",")[0].split("-")[0]
    return f"{prefix}{first}"


def detect_launch(env: Mapping[str, str] | None = None) -> LaunchInfo:
    """Rank, world size, local rank and rendezvous address from torchrun, SLURM or Open MPI variables.

    torchrun's variables win when several launchers' are present (torchrun inside an srun allocation);
    with none present this is a single process.
    """
    env = os.environ if env is None else env
    port = _int(env, "MASTER_PORT") if "MASTER_PORT" in env else DEFAULT_PORT
    if "RANK" in env and "WORLD_SIZE" in env:
        return LaunchInfo(
            rank=_int(env, "RANK"),
            world_size=_int(env, "WORLD_SIZE"),
            local_rank=_int(env, "LOCAL_RANK") if "LOCAL_RANK" in env else 0,
            local_world_size=_int(env, "LOCAL_WORLD_SIZE") if "LOCAL_WORLD_SIZE" in env else 1,
            master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
            master_port=port,
            launcher="torchrun",
        )
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or "127.0.0.1"
        tasks_per_node = env.get("SLURM_NTASKS_PER_NODE", "").split("(")[0]
        return LaunchInfo(
            rank=_int(env, "SLURM_PROCID"),
            world_size=_int(env, "SLURM_NTASKS"),
            local_rank=_int(env, "SLURM_LOCALID") if "SLURM_LOCALID" in env else 0,
            local_world_size=int(tasks_per_node) if tasks_per_node.isdigit() else 1,
            master_addr=env.get("MASTER_ADDR") or first_slurm_host(nodelist),
            master_port=port,
            launcher="slurm",
        )
    if "OMPI_COMM_WORLD_RANK" in env and "OMPI_COMM_WORLD_SIZE" in env:
        return LaunchInfo(
            rank=_int(env, "OMPI_COMM_WORLD_RANK"),
            world_size=_int(env, "OMPI_COMM_WORLD_SIZE"),
            local_rank=_int(env, "OMPI_COMM_WORLD_LOCAL_RANK") if "OMPI_COMM_WORLD_LOCAL_RANK" in env else 0,
            local_world_size=(
                _int(env, "OMPI_COMM_WORLD_LOCAL_SIZE") if "OMPI_COMM_WORLD_LOCAL_SIZE" in env else 1
            ),
            master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
            master_port=port,
            launcher="openmpi",
        )
    return LaunchInfo()
