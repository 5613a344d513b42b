"""Two ranks resume from ``ckpt/`` in the folder given for each (``<rank 0's> [<rank 1's>]``): when one rank
cannot resume (rank 0 finds no usable checkpoint; rank 1 cannot see rank 0's choice, as on a node without the
shared disk), every rank raises one line (tests/core/loop/test_runs.py)."""

from __future__ import annotations

import os
import sys

import torch

import devplug


def main() -> int:
    rank = int(os.environ["RANK"])
    os.chdir(sys.argv[1 + min(rank, len(sys.argv) - 2)])
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False, count_flops=False,
                              checkpoints=devplug.CheckpointPolicy(directory="ckpt"))
    model = trainer.setup(torch.nn.Linear(3, 3), name="net")
    trainer.optimizer("sgd", model.parameters(), lr=0.1)
    try:
        trainer.resume()
        trainer.barrier()  # the first collective after the resume
        print(f"rank {trainer.rank}: resumed", flush=True)
        code = 0
    except devplug.DevplugError as exc:
        print(f"rank {trainer.rank}: {type(exc).__name__}: {exc}", flush=True)
        code = 3
    trainer.close()
    return code


if __name__ == "__main__":
    sys.exit(main())
