"""Two FSDP ranks save a sharded checkpoint, then load it while rank 1's registered object refuses its state:
every rank raises one line and keeps its weights, and the ranks still meet at the next collective (none is
left waiting inside the checkpoint read) (tests/core/checkpoint/test_checkpoint_all_or_nothing.py)."""

from __future__ import annotations

import os
import sys

import torch
from fsdp_model import Block, Picky, lm_loss, make_lm, rank_batch

import devplug


def main() -> int:
    rank = int(os.environ["RANK"])
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False, count_flops=False,
                              strategy="fsdp", seed=0)
    model = trainer.setup(make_lm(), name="lm", shard=[Block])
    opt = trainer.optimizer("adamw", model.parameters(), lr=1e-2)
    picky = Picky()
    trainer.register_for_checkpointing(picky=picky)
    trainer.backward(lm_loss(model, rank_batch(0, rank, 2)))
    trainer.step(opt)
    path = trainer.save(os.path.join(sys.argv[1], "folder"))
    trainer.backward(lm_loss(model, rank_batch(1, rank, 2)))
    trainer.step(opt)
    before, step = [p.to_local().detach().clone() for p in model.parameters()], trainer.global_step
    picky.version = 2 if rank == 1 else 1
    try:
        trainer.load(path)
        outcome = "loaded"
    except devplug.DevplugError as exc:
        outcome = f"{type(exc).__name__}: {exc}"
    kept = all(torch.equal(a, p.to_local()) for a, p in zip(before, model.parameters(), strict=True))
    trainer.barrier()  # the first collective after the load
    print(f"rank {rank}: {outcome} | weights kept: {kept} | position kept: {trainer.global_step == step}", flush=True)
    trainer.close()
    return 3 if outcome != "loaded" else 0


if __name__ == "__main__":
    sys.exit(main())
