"""Two ranks; rank 0 alone calls ``flush_logs()``: it fails with one line, not a hang (tests/core/loop/test_runs.py)."""

from __future__ import annotations

import os
import time

import torch

import devplug


def main() -> None:
    rank = int(os.environ["RANK"])
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False, count_flops=False)
    trainer.log(loss=torch.tensor(1.0))
    if rank == 0:
        try:
            trainer.flush_logs()
            print("no error")
        except devplug.ConfigError as exc:
            print(exc, flush=True)
    else:
        time.sleep(8)  # never calls flush_logs; long enough for rank 0 to give up waiting
    os._exit(0)  # the process group is unusable after the failed collective


if __name__ == "__main__":
    main()
