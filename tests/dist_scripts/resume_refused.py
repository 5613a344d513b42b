"""Two ranks resume from a folder where rank 0 finds no usable checkpoint: both raise its one line (test_runs.py)."""

from __future__ import annotations

import sys

import torch

import devplug


def main() -> int:
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False, count_flops=False,
                              checkpoints=devplug.CheckpointPolicy(directory=sys.argv[1]))
    model = trainer.setup(torch.nn.Linear(3, 3), name="net")
    trainer.optimizer("sgd", model.parameters(), lr=0.1)
    try:
        trainer.resume()
        print(f"rank {trainer.rank}: resumed", flush=True)
        code = 0
    except devplug.DevplugError as exc:
        print(f"rank {trainer.rank}: {type(exc).__name__}: {exc}", flush=True)
        code = 3
    trainer.close()
    return code


if __name__ == "__main__":
    sys.exit(main())
