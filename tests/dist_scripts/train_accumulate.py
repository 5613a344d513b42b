"""Two ranks under a torchrun-like launch: gradient accumulation over 2 micro-batches, a mid-epoch checkpoint.

Run by tests/distributed/test_distributed_accumulate.py through ``common.run_ranks``. Counts DDP's gradient all-reduces
per micro-batch with a communication hook, saves a checkpoint right after the first optimizer step, and
records the final weights and the samples each rank saw.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import common
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

import devplug


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--samples", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=4)
    args = parser.parse_args()
    rank = int(os.environ["RANK"])
    trainer = devplug.Trainer(device="cpu", precision="32-true", seed=0, progress=False, accumulate_grad_batches=2)
    model = trainer.setup(common.make_model(0), name="mlp")
    allreduces: list[int] = []

    def counting_hook(state, bucket):  # no annotations: DDP checks them, and they are strings here
        allreduces[-1] += 1
        return default_hooks.allreduce_hook(None, bucket)

    model.register_comm_hook(None, counting_hook)
    opt = trainer.optimizer("sgd", model.parameters(), lr=0.1, momentum=0.9)
    loader = trainer.dataloader(common.IndexedData(args.samples), args.batch_size, shuffle=True, num_workers=0)
    seen, steps = [], 0
    for _epoch in trainer.epochs(1):
        for index, x, y in loader:
            seen.append([int(i) for i in index])
            allreduces.append(0)
            with trainer.accumulate(model):
                trainer.backward(torch.nn.functional.mse_loss(model(x), y))
                stepped = trainer.step(opt)
            steps += stepped
            if stepped and steps == 1:
                trainer.save(args.out / "after_step1.pt")
    final = {k: v.detach().clone() for k, v in trainer._modules["mlp"].state_dict().items()}
    torch.save({"allreduces": allreduces, "seen": seen, "final": final, "global_step": trainer.global_step},
               args.out / f"rank{rank}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
