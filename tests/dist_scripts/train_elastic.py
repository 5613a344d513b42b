"""A small elastic training job for the fault test: checkpoints every k steps, resumes from the latest.

Run under ``torchrun --nproc-per-node 2 --max-restarts 1`` (tests/distributed/test_distributed_elastic.py). Rank
``--kill-rank`` kills itself with SIGKILL right after the checkpoint of step ``--kill-at`` exists on
disk, once (a marker file remembers it). torchrun then stops the other rank and restarts both; they
resume from the latest checkpoint and finish ``--steps`` steps.

Each start and the end are appended as JSON lines to ``--events`` (one ``write`` per line, so the two
ranks' lines do not interleave); rank 0 saves the final weights to ``--final``.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import common
import torch

import devplug


def latest_checkpoint(folder: Path) -> Path | None:
    """The checkpoint with the highest step number in ``folder`` (temporary files are ignored)."""
    found = sorted(folder.glob("step*.pt"))
    return found[-1] if found else None


def event(path: Path, **fields: Any) -> None:
    line = json.dumps(fields) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ckpt-dir", type=Path, required=True)
    parser.add_argument("--events", type=Path, required=True)
    parser.add_argument("--final", type=Path, required=True)
    parser.add_argument("--marker", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--every", type=int, default=3)
    parser.add_argument("--kill-at", type=int, default=6)
    parser.add_argument("--kill-rank", type=int, default=1)
    parser.add_argument("--samples", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=4)
    args = parser.parse_args()
    faulthandler.enable()  # a native abort (SIGABRT) prints the Python stack it happened under
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))

    trainer = devplug.Trainer(device="cpu", precision="32-true", seed=0, progress=False, log_every=args.every)
    rank = trainer.rank
    model = trainer.setup(common.make_model(0), name="mlp")
    opt = trainer.optimizer("sgd", model.parameters(), lr=0.1, momentum=0.9)
    loader = trainer.dataloader(common.IndexedData(args.samples), batch_size=args.batch_size, shuffle=True,
                                num_workers=0)
    latest = latest_checkpoint(args.ckpt_dir)
    resumed_from = None
    if latest is not None:
        trainer.load(latest)
        resumed_from = trainer.global_step
    event(args.events, kind="start", rank=rank, restart=restart, launcher=trainer.launch.launcher,
          world_size=trainer.world_size, resumed_from=resumed_from, checkpoint=latest.name if latest else None,
          epoch=trainer.epoch, batches_in_epoch=trainer._position.batches_in_epoch)

    steps_run = 0
    for _epoch in trainer.epochs(1000, max_steps=args.steps):
        for _index, x, y in loader:
            with trainer.autocast():
                loss = torch.nn.functional.mse_loss(model(x), y)
            trainer.backward(loss)
            trainer.step(opt)
            trainer.log(loss=loss)
            steps_run += 1
            step = trainer.global_step
            if step % args.every == 0:
                path = args.ckpt_dir / f"step{step:06d}.pt"
                trainer.save(path)
                if rank == args.kill_rank and step == args.kill_at and not args.marker.exists():
                    deadline = time.monotonic() + 60
                    while not path.exists() and time.monotonic() < deadline:  # rank 0 writes it
                        time.sleep(0.02)
                    args.marker.write_text(f"rank {rank} killed itself after step {step}\n")
                    event(args.events, kind="kill", rank=rank, step=step, restart=restart)
                    os.kill(os.getpid(), signal.SIGKILL)

    event(args.events, kind="end", rank=rank, restart=restart, global_step=trainer.global_step, steps_run=steps_run,
          loss=trainer.last_metrics.get("loss"))
    if trainer.is_main_process:
        torch.save({k: v.detach().clone() for k, v in trainer._modules["mlp"].state_dict().items()}, args.final)
    trainer.close()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
