"""README.md's loop, run unchanged on each rank; records its evaluation accuracy and a gathered pass.

Run by tests/distributed/test_distributed.py through ``common.run_ranks`` (2 and 3 ranks; 1,001 evaluation samples
split unevenly). ``MyNet`` predicts classes training cannot change, so every world size must report the
accuracy one process computes.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import common
import torch
import torch.distributed as dist


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    rank = int(os.environ.get("RANK", "0"))
    namespace = common.loop_namespace()
    os.chdir(args.out)  # the loop writes runs/classifier/ under the working folder
    exec(compile(common.documented_loop(), "README.md", "exec"), namespace)
    trainer, model, val = namespace["trainer"], namespace["model"], namespace["val"]
    model.eval()
    with torch.no_grad():
        mine = torch.cat([model(x).argmax(dim=1) for x, _y in val])
    gathered = trainer.gather(mine)  # one pass's predictions from every rank, uneven shards
    trainer.close()
    torch.save({"correct": int(namespace["correct"]), "val_accuracy": trainer.last_metrics["val_accuracy"],
                "mine": len(mine), "gathered": gathered}, args.out / f"rank{rank}.pt")
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
