"""A sharded run whose rank 1 is SIGKILLed in the middle of a checkpoint save, then resumed by torchrun's restart.

Run under ``torchrun --nproc-per-node 2 --max-restarts 1`` by tests/distributed/test_fsdp.py. Two gloo ranks
train the model of train_fsdp.py with its own step (`train_fsdp.train_step`) and strategy="fsdp"; a
``CheckpointPolicy`` saves a sharded checkpoint folder every ``--every`` steps into ``--ckpt-dir``, and
``trainer.resume()`` at the start continues from the newest complete one (the library's auto-resume).

On the first attempt only (``TORCHELASTIC_RESTART_COUNT`` 0), rank 1 kills itself with SIGKILL inside the
save of step ``--kill-at``: DCP's storage writer has written this rank's shard files (their bytes are on
disk) and returns its results to the coordinator, which would then write ``.metadata``; the kill comes
before that, so the save never completes. Nothing races against the kill: it happens inside the save path.

Each start, the kill and the end are appended as JSON lines to ``--events`` (one ``write`` per line); rank 0
saves the final full weights to ``--final``.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from fsdp_model import ADAMW, STEPS, Block, full_weights, make_lm, rank_batch
from torch.distributed.checkpoint import FileSystemWriter
from train_fsdp import train_step

import devplug


def event(path: Path, **fields: Any) -> None:
    """Append one JSON line to ``path`` with a single ``write`` (the ranks' lines never interleave)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, (json.dumps(fields) + "\n").encode())
    finally:
        os.close(fd)


def listing(folder: Path) -> dict[str, list[str]]:
    """Every entry of ``folder`` and the files inside each of its subfolders (sorted)."""
    if not folder.is_dir():
        return {}
    return {entry.name: sorted(p.name for p in entry.iterdir()) if entry.is_dir() else []
            for entry in sorted(folder.iterdir())}


def kill_inside_save(events: Path, checkpoint_name: str) -> None:
    """SIGKILL this process once DCP has written its shards for the save of ``checkpoint_name``, before it completes.

    Whatever folder the save writes into (the library's staging folder, named after the checkpoint).
    """
    write_data = FileSystemWriter.write_data

    def write_then_die(self: Any, plan: Any, planner: Any) -> Any:
        future = write_data(self, plan, planner)
        staging = Path(str(self.path))
        if checkpoint_name in staging.name:
            written = future.wait()  # this rank's shard files are complete on disk; the coordinator waits for them
            files = {p.name: p.stat().st_size for p in sorted(staging.iterdir())}
            event(events, kind="kill", rank=dist.get_rank(), folder=staging.name, files=files, results=len(written))
            os.kill(os.getpid(), signal.SIGKILL)
        return future

    FileSystemWriter.write_data = write_then_die  # type: ignore[method-assign]


class Batches:
    """This rank's batches, the same ones in the same order on every pass (an iterable, not a Dataset)."""

    def __init__(self, items: list[torch.Tensor]) -> None:
        self.items = items

    def __iter__(self) -> Iterator[torch.Tensor]:
        return iter(self.items)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ckpt-dir", type=Path, required=True)
    parser.add_argument("--events", type=Path, required=True)
    parser.add_argument("--final", type=Path, required=True)
    parser.add_argument("--every", type=int, default=2)
    parser.add_argument("--kill-at", type=int, default=4, help="the step whose save rank 1 dies in (0: none)")
    args = parser.parse_args()
    faulthandler.enable()
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))

    policy = devplug.CheckpointPolicy(directory=args.ckpt_dir, every_n_steps=args.every, keep_last=None)
    trainer = devplug.Trainer(device="cpu", precision="32-true", seed=0, progress=False, strategy="fsdp",
                              checkpoints=policy)
    rank = trainer.rank
    if rank == 1 and restart == 0 and args.kill_at:
        kill_inside_save(args.events, f"step_{args.kill_at:07d}.pt")
    model = trainer.setup(make_lm(0), name="lm", shard=[Block])
    opt = trainer.optimizer("adamw", model.parameters(), **ADAMW)
    loader = trainer.dataloader(Batches([rank_batch(step, rank, trainer.world_size) for step in range(STEPS)]))
    before = listing(args.ckpt_dir)
    dist.barrier()  # rank 0's resume may move folders: every rank lists the folder before it
    resumed = trainer.resume()
    event(args.events, kind="start", rank=rank, restart=restart, launcher=trainer.launch.launcher,
          world_size=trainer.world_size, folder=before,
          resumed=None if resumed is None else {"path": resumed.path.name, "step": resumed.step,
                                                "set_aside": resumed.set_aside_count})
    losses = {}
    for _epoch in trainer.epochs(1):
        for tokens in loader:
            step = trainer.global_step - 1  # the loader has counted the step this batch is for
            losses[step], _norm = train_step(trainer, model, opt, tokens)
    final = full_weights(trainer._modules["lm"])  # a collective: every rank gathers
    event(args.events, kind="end", rank=rank, restart=restart, global_step=trainer.global_step, losses=losses)
    if trainer.is_main_process:
        torch.save(final, args.final)
    trainer.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
