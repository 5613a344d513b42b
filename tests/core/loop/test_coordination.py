"""The small calls users expect from Fabric and Accelerate: barrier, main_process_first, broadcast, unwrap."""

from __future__ import annotations

import json

import pytest
import torch
from dist_scripts.common import HERE, run_ranks

import devplug


def test_in_one_process_they_are_the_plain_operations():
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False, loggers=[])
    trainer.barrier()
    ran = []
    with trainer.main_process_first():
        ran.append(True)
    assert ran == [True]
    value = {"a": [1, 2]}
    assert trainer.broadcast(value) is value
    with pytest.raises(devplug.ConfigError, match="broadcast src must be a rank from 0 to 0, got 1"):
        trainer.broadcast(value, src=1)
    model = torch.nn.Linear(2, 1)
    assert trainer.unwrap(trainer.setup(model)) is model
    compiled = torch.compile(torch.nn.Linear(2, 1))
    assert trainer.unwrap(trainer.setup(compiled, name="compiled")) is compiled._orig_mod


@pytest.mark.slow
def test_on_two_ranks_they_order_share_and_unwrap(tmp_path):
    run_ranks(HERE / "coordination.py", [str(tmp_path)], world_size=2, timeout=120)
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["seen"] for r in results] == ["ready", "ready"]  # rank 1 ran its block after rank 0's
    assert [r["chosen"] for r in results] == [{"run": "chosen by rank 1", "rank": 1}] * 2
    assert [r["arrived"] for r in results] == [["arrived0", "arrived1"]] * 2
    assert [r["unwrapped"] for r in results] == [True, True]  # the DDP wrapper taken off
    # rank 0's block failed: rank 1 did not run it (a second download, say) and was told, rather than going on
    # to wait at its next collective for a rank that has gone
    main, other = (r["after_failure"] for r in results)
    assert main == {"ran": False, "error": "OSError: the download failed"}
    assert other["ran"] is False and other["error"].startswith("DevplugError: the main process failed"), other
