"""One rank that joins through whatever launcher variables it was given and prints what it saw (JSON).

Used by tests/distributed/test_distributed.py to run the ``tcp://`` rendezvous path (SLURM/MPI-style variables,
no ``MASTER_ADDR``) for real: one DDP backward, then a check that the gradient is the ranks' mean.
"""

from __future__ import annotations

import json

import torch
import torch.distributed as dist

import devplug


def main() -> None:
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False, seed=0)
    model = trainer.setup(torch.nn.Linear(2, 1, bias=False), name="probe")
    model(torch.full((1, 2), float(trainer.rank + 1))).sum().backward()
    grad = trainer._modules["probe"].weight.grad
    print(json.dumps({"launch": {k: getattr(trainer.launch, k) for k in ("rank", "world_size", "local_rank",
                                                                         "local_world_size", "master_addr",
                                                                         "launcher")},
                      "wrapped": type(model).__name__, "grad": grad.tolist()}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
