"""Fault tolerance under torch elastic: a rank SIGKILLed after a checkpoint, the job restarts and resumes.

``python -m torch.distributed.run --nproc-per-node 2 --max-restarts 1`` (torchrun) with a c10d
rendezvous on 127.0.0.1 runs tests/dist_scripts/train_elastic.py on gloo. Rank 1 kills itself once
right after the step-6 checkpoint (mid-epoch: 5 steps per epoch); torchrun restarts both ranks, which
resume from that checkpoint and finish 12 steps. The result must equal an uninterrupted run.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from dist_scripts import common

STEPS, EVERY, KILL_AT, SAMPLES, BATCH, WORLD = 12, 3, 6, 40, 4, 2


@pytest.mark.slow
def test_killed_rank_restarts_and_the_job_resumes_from_the_last_checkpoint(tmp_path):
    events, final, marker = tmp_path / "events.jsonl", tmp_path / "final.pt", tmp_path / "killed.marker"
    command = [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes", "1", "--nproc-per-node", str(WORLD), "--max-restarts", "1",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{common.free_port()}", "--rdzv-id", "devplug-elastic",
        "--monitor-interval", "0.1",
        str(common.HERE / "train_elastic.py"),
        "--ckpt-dir", str(tmp_path / "ckpt"), "--events", str(events), "--final", str(final), "--marker", str(marker),
        "--steps", str(STEPS), "--every", str(EVERY), "--kill-at", str(KILL_AT),
        "--samples", str(SAMPLES), "--batch-size", str(BATCH),
    ]
    try:
        proc = subprocess.run(command, env=common.clean_env(), cwd=common.REPO, capture_output=True, text=True,
                              timeout=240)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"torchrun did not finish:\n{exc.stdout}\n{exc.stderr}")
    log_text = events.read_text() if events.exists() else "(no events)"
    output = f"events:\n{log_text}\nstdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-12000:]}"
    assert proc.returncode == 0, output
    assert marker.exists(), output

    log = [json.loads(line) for line in events.read_text().splitlines()]
    starts = [e for e in log if e["kind"] == "start"]
    # first attempt: both ranks start fresh; rank 1 dies after step 6's checkpoint
    assert sorted((e["rank"], e["restart"], e["resumed_from"]) for e in starts) == [
        (0, 0, None), (0, 1, KILL_AT), (1, 0, None), (1, 1, KILL_AT)], log
    assert all(e["launcher"] == "torchrun" and e["world_size"] == WORLD for e in starts)
    kills = [e for e in log if e["kind"] == "kill"]
    assert kills == [{"kind": "kill", "rank": 1, "step": KILL_AT, "restart": 0}]
    resumed = [e for e in starts if e["restart"] == 1]
    assert all(e["checkpoint"] == f"step{KILL_AT:06d}.pt" for e in resumed)
    # step 6 is the first batch of epoch 1: the resumed loader skips it and continues mid-epoch
    assert all((e["epoch"], e["batches_in_epoch"]) == (1, 1) for e in resumed)

    ends = [e for e in log if e["kind"] == "end"]
    assert sorted((e["rank"], e["restart"], e["global_step"], e["steps_run"]) for e in ends) == [
        (0, 1, STEPS, STEPS - KILL_AT), (1, 1, STEPS, STEPS - KILL_AT)]
    assert sorted(p.name for p in (tmp_path / "ckpt").glob("*.pt")) == [
        f"step{s:06d}.pt" for s in range(EVERY, STEPS + 1, EVERY)]

    # the interrupted job ends exactly where an uninterrupted one does
    weights = torch.load(final, weights_only=True)
    expected = common.train_on_concatenated_batches(STEPS, samples=SAMPLES, batch_size=BATCH, world_size=WORLD)
    for name, value in expected.items():
        torch.testing.assert_close(weights[name], value, rtol=1e-5, atol=1e-6)
