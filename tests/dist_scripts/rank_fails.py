"""Two DDP ranks run through `devplug.ConfigParser.run`; one of them fails at step 3, the other must say so in one line.

``--case dies``: rank 1 ends abruptly (``os._exit``), as a killed or crashed process does. ``--case nonfinite``:
rank 1's loss turns NaN at step 3, DDP spreads it to both replicas, and rank 0 refuses the policy's step-4
checkpoint (checkpoints are written by rank 0 alone). Run by tests/distributed/test_dist_faults.py.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import common
import torch

import devplug


def train(args: argparse.Namespace) -> int:
    rank = int(os.environ["RANK"])
    policy = devplug.CheckpointPolicy(directory=args.out, every_n_steps=2)
    trainer = devplug.Trainer(device="cpu", precision="32-true", seed=0, progress=False, log_every=50,
                              checkpoints=policy, stop_signals=())
    model = trainer.setup(common.make_model(0), name="mlp")
    opt = trainer.optimizer("sgd", model.parameters(), lr=0.1)
    loader = trainer.dataloader(common.IndexedData(40), 2, shuffle=True, num_workers=0)
    for _epoch in trainer.epochs(3):
        for _index, x, y in loader:
            if rank == 1 and trainer.global_step == 3 and args.case == "dies":
                os._exit(3)
            loss = torch.nn.functional.mse_loss(model(x), y)
            if rank == 1 and trainer.global_step == 3 and args.case == "nonfinite":
                loss = loss * float("nan")
            trainer.backward(loss)
            trainer.step(opt)
    trainer.close()
    return trainer.exit_code


def main() -> int:
    parser = devplug.ConfigParser("rank_fails", config_file=False)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--case", choices=("dies", "nonfinite"), required=True)
    return parser.run(train)


if __name__ == "__main__":
    devplug.ConfigParser.run_as_script(main)
