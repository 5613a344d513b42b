"""Running a benchmark as several local gloo ranks, or as one rank of a job a launcher started."""

from __future__ import annotations

import argparse
import os
import socket
from collections.abc import Callable
from typing import Any

import torch.multiprocessing as mp

RankMain = Callable[[int, int, "int | None", argparse.Namespace], None]


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def join_as(rank: int, world_size: int, port: int | None) -> None:
    """Set the launcher variables a spawned rank needs (``port`` is ``None`` when a launcher set them)."""
    if port is not None:
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
                          LOCAL_WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))


def run_ranks(run_rank: RankMain, args: Any, parser: argparse.ArgumentParser) -> None:
    """``run_rank`` as this rank of a torchrun job, or spawned ``args.world_size`` times over loopback."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # launched by torchrun / an srun wrapper
        run_rank(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), None, args)
        return
    if args.world_size < 2:
        parser.error("--world-size must be at least 2")
    mp.spawn(run_rank, args=(args.world_size, free_port(), args), nprocs=args.world_size, join=True)
