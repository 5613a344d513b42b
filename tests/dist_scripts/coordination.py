"""Two ranks: barrier, main_process_first (its block passing, then failing on rank 0), broadcast and unwrap.

Run by tests/core/loop/test_coordination.py.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch

import devplug


def main() -> None:
    out = Path(sys.argv[1])
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False, count_flops=False, loggers=[])
    rank = trainer.rank
    cache = out / "cache.txt"
    with trainer.main_process_first():  # rank 0 writes the cache; rank 1 finds it written
        if rank == 0:
            time.sleep(1.0)
            cache.write_text("ready")
        seen = cache.read_text() if cache.exists() else "missing"
    chosen = trainer.broadcast({"run": f"chosen by rank {rank}", "rank": rank}, src=1)
    (out / f"arrived{rank}").write_text("x")
    trainer.barrier()  # after it, every rank has written its file
    arrived = sorted(p.name for p in out.glob("arrived*"))
    ran, failure = False, None
    try:
        with trainer.main_process_first():  # rank 0's block fails: rank 1 must not run it, and must hear why
            if rank == 0:
                raise OSError("the download failed")
            ran = True
    except Exception as exc:
        failure = f"{type(exc).__name__}: {exc}"
    model = torch.nn.Linear(2, 1)
    plain = trainer.unwrap(trainer.setup(model))
    (out / f"rank{rank}.json").write_text(json.dumps({
        "seen": seen, "chosen": chosen, "arrived": arrived, "unwrapped": plain is model,
        "after_failure": {"ran": ran, "error": failure}}))
    trainer.close()
    torch.distributed.destroy_process_group()
    os._exit(0)


if __name__ == "__main__":
    main()
