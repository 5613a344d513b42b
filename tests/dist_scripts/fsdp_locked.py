"""Two FSDP ranks start a run on a checkpoint folder another job holds (run by tests/core/checkpoint/test_run_lock.py).

Each rank prints the one line the Trainer refused it with and exits 3; a rank that gets past the Trainer
(not refused) exits 0.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import devplug


def main() -> int:
    folder = Path(sys.argv[1])
    try:
        devplug.Trainer(device="cpu", precision="32-true", strategy="fsdp", progress=False,
                        checkpoints=devplug.CheckpointPolicy(directory=folder))
    except devplug.CheckpointError as exc:
        print(f"rank {os.environ['RANK']}: {exc}", flush=True)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
