"""Stand-in for ``habana_frameworks.torch.distributed.hccl``.

Like the real module, importing it registers the ``hccl`` backend with ``torch.distributed`` (the
stand-in's cannot create a process group) and calls ``initialize_distributed_hpu()`` once.
``initialize_distributed_hpu(world_size=None, rank=None, local_rank=None)`` works as the real one:
explicit values are written to ``WORLD_SIZE``/``RANK``/``LOCAL_RANK``; otherwise Open MPI's
``OMPI_COMM_WORLD_*`` are copied there (with ``MASTER_ADDR``/``MASTER_PORT`` defaulting to
``localhost:12345``); then it returns ``(world_size, rank, local_rank)`` read from those variables,
``(1, -1, -1)`` outside a distributed launch, and sets ``ID`` (and ``WORLD_SIZE``). It does not pick a
card (``HLS_MODULE_ID``), as there is none.
"""

from __future__ import annotations

import os

import hpu_standin_calls
import torch.distributed as dist

_MPI_TO_TORCHRUN = {
    "OMPI_COMM_WORLD_LOCAL_RANK": "LOCAL_RANK",
    "OMPI_COMM_WORLD_SIZE": "WORLD_SIZE",
    "OMPI_COMM_WORLD_RANK": "RANK",
}


def _no_hccl(*args: object, **kwargs: object) -> None:
    """Where the real backend creates a process group (HabanaAI/gaudi-pytorch-bridge 1.19,
    python_packages/habana_frameworks/torch/distributed/hccl/
    __init__.py line 116)."""
    raise RuntimeError("the HPU stand-in cannot create an HCCL process group")


if "hccl" not in dist.Backend.backend_list:
    dist.Backend.register_backend("hccl", _no_hccl, devices=["hpu"])


def _setup_environment_from_mpi() -> None:
    """Open MPI's variables copied to torchrun's, rendezvous defaulting to localhost:12345 (hccl/__init__.py
    lines 60-81)."""
    if all(name in os.environ for name in _MPI_TO_TORCHRUN.values()):
        return
    if all(name in os.environ for name in _MPI_TO_TORCHRUN):
        for mpi_name, name in _MPI_TO_TORCHRUN.items():
            os.environ[name] = os.environ[mpi_name]
    os.environ.setdefault("MASTER_ADDR", "localhost")
    os.environ.setdefault("MASTER_PORT", "12345")


def initialize_distributed_hpu(
    world_size: int | None = None, rank: int | None = None, local_rank: int | None = None
) -> tuple[int, int, int]:
    """World size, rank and local rank of a torchrun or mpirun launch: ``(1, -1, -1)`` outside one
    (hccl/__init__.py lines 53-113)."""
    if world_size is not None and rank is not None and local_rank is not None:
        os.environ.update(WORLD_SIZE=str(world_size), RANK=str(rank), LOCAL_RANK=str(local_rank))
    else:
        _setup_environment_from_mpi()
    world_size = int(os.getenv("WORLD_SIZE", 1))
    rank = int(os.getenv("RANK", -1))
    local_rank = int(os.environ.get("LOCAL_RANK", -1))
    if rank != -1:
        os.environ["ID"] = str(rank)
    os.environ["WORLD_SIZE"] = str(world_size)
    hpu_standin_calls.record("initialize_distributed_hpu", world_size=world_size, rank=rank, local_rank=local_rank)
    return world_size, rank, local_rank


hpu_standin_calls.record("hccl.import")
initialize_distributed_hpu()
