"""Two ranks; rank 0 alone receives SIGTERM during step 3: both must stop after the same step, rank 0 saves.

Run by tests/core/loop/test_signals.py through ``common.run_ranks`` (each rank exits with ``trainer.exit_code``).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

import common
import torch
import torch.distributed as dist

import devplug


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    rank = int(os.environ["RANK"])
    trainer = devplug.Trainer(device="cpu", precision="32-true", seed=0, progress=False)
    model = trainer.setup(common.make_model(0), name="mlp")
    opt = trainer.optimizer("sgd", model.parameters(), lr=0.1)
    loader = trainer.dataloader(common.IndexedData(40), 2, shuffle=True, num_workers=0)
    for _epoch in trainer.epochs(3):
        for _index, x, y in loader:
            trainer.backward(torch.nn.functional.mse_loss(model(x), y))
            trainer.step(opt)
            if rank == 0 and trainer.global_step == 3:
                os.kill(os.getpid(), signal.SIGTERM)
    saved = trainer.save(args.out / "stopped.pt")
    torch.save({"global_step": trainer.global_step, "exit_code": trainer.exit_code, "saved": saved},
               args.out / f"rank{rank}.pt")
    dist.destroy_process_group()
    return trainer.exit_code


if __name__ == "__main__":
    sys.exit(main())
