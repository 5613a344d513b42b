"""Two DDP ranks under torchrun with a checkpoint policy (auto_resume); run by tests/distributed/test_launcher_death.py.

With ``--hang-after K`` each rank, once the checkpoint of step K is written, writes its pid to
``<out>/pid<rank>`` and waits forever: the test then kills torchrun with SIGKILL and watches the ranks end
with it. Without it the ranks train to ``--steps`` (resuming from the policy's folder) and rank 0 saves
the final weights to ``<out>/final.pt``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import common
import torch
import torch.distributed as dist

import devplug


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--hang-after", type=int, default=0)
    args = parser.parse_args()
    rank = int(os.environ["RANK"])
    policy = devplug.CheckpointPolicy(directory=args.out / "ckpt", every_n_steps=2, auto_resume=True)
    trainer = devplug.Trainer(device="cpu", precision="32-true", seed=0, progress=False, checkpoints=policy,
                              count_flops=False)
    model = trainer.setup(common.make_model(0), name="mlp")
    opt = trainer.optimizer("sgd", model.parameters(), lr=0.1, momentum=0.9)
    loader = trainer.dataloader(common.IndexedData(40), 2, shuffle=True, num_workers=0)
    started = False
    for _epoch in trainer.epochs(100, max_steps=args.steps):
        if not started:  # auto_resume has run
            print(f"rank {rank} starts at step {trainer.global_step}", flush=True)
            started = True
        for _index, x, y in loader:
            trainer.backward(torch.nn.functional.mse_loss(model(x), y))
            trainer.step(opt)
            if args.hang_after and trainer.global_step == args.hang_after:
                trainer.checkpoint_now()  # at the step boundary: the checkpoint of this step
                (args.out / f"pid{rank}").write_text(str(os.getpid()))
                while True:
                    time.sleep(1)
    if rank == 0:
        torch.save({k: v.clone() for k, v in model.state_dict().items()}, args.out / "final.pt")
    trainer.close()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
