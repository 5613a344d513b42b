"""Two ranks under a checkpoint policy; rank 1 alone asks to stop after step 3 (run by tests/core/loop/test_runs.py).

With ``--resume`` the ranks auto-resume from the policy's folder and train to the end; each rank writes
what it saw to ``rank<r>.pt``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import common
import torch
import torch.distributed as dist

import devplug


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args()
    rank = int(os.environ["RANK"])
    policy = devplug.CheckpointPolicy(directory=args.out / "ckpt", every_n_steps=2, auto_resume=args.resume)
    trainer = devplug.Trainer(device="cpu", precision="32-true", seed=0, progress=False, checkpoints=policy,
                              count_flops=False)
    model = trainer.setup(common.make_model(0), name="mlp")
    opt = trainer.optimizer("sgd", model.parameters(), lr=0.1)
    loader = trainer.dataloader(common.IndexedData(40), 2, shuffle=True, num_workers=0)
    resumed_at = None
    for _epoch in trainer.epochs(4):
        resumed_at = trainer.global_step if resumed_at is None else resumed_at
        for _index, x, y in loader:
            trainer.backward(torch.nn.functional.mse_loss(model(x), y))
            trainer.step(opt)
            if rank == 1 and trainer.global_step == 3 and not args.resume:
                trainer.request_stop("rank 1 had enough")
    summary = trainer.summary()
    torch.save({"global_step": trainer.global_step, "exit_code": trainer.exit_code, "resumed_at": resumed_at,
                "stop_reason": summary["stop_reason"]}, args.out / f"rank{rank}.pt")
    trainer.close()
    dist.destroy_process_group()
    return trainer.exit_code


if __name__ == "__main__":
    sys.exit(main())
