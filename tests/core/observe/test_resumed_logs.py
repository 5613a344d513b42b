"""After a kill and an automatic resume: one line says what was resumed, and the log files hold one curve.

The killed run wrote points past its last checkpoint; the resumed run computes those steps again. TensorBoard
purges the old points past the resumed step, CSV and JSON Lines are rewritten without them.
"""

from __future__ import annotations

import csv
import json
import time
from collections import Counter

import pytest
import torch

import devplug


def _run(tmp_path, *, steps: int, close: bool) -> devplug.Trainer:
    policy = devplug.CheckpointPolicy(directory=tmp_path / "ckpt", every_n_steps=4, keep_last=None,
                                      auto_resume=True, at_end=close)
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False, log_every=1, count_flops=False,
                              log_dir=str(tmp_path / "logs"), loggers=["tensorboard", "csv", "jsonl"],
                              stop_signals=(), checkpoints=policy, seed=0)
    model = trainer.setup(torch.nn.Linear(2, 1))
    opt = trainer.optimizer("sgd", model.parameters(), lr=0.01)
    loader = trainer.dataloader(torch.utils.data.TensorDataset(torch.randn(12, 2)), 1, num_workers=0)
    for _ in trainer.epochs(1, max_steps=steps):
        for (x,) in loader:
            trainer.backward(model(x).sum())
            trainer.step(opt)
            trainer.log(loss=torch.tensor(100.0 * close + trainer.global_step))  # the runs' values differ
    if close:
        trainer.close()
    else:
        trainer.writer.flush()  # what a killed run had written: no close, no final point
    return trainer


def test_a_resume_says_what_it_resumed_and_the_logs_drop_the_killed_runs_points_past_it(tmp_path, capsys):
    pytest.importorskip("tensorboard")
    _run(tmp_path, steps=10, close=False)  # checkpoints at 4 and 8; points written up to step 10, then "killed"
    capsys.readouterr()
    # TensorBoard reads event files in name order, whose first field is the second they were opened in: a
    # resumed run is a later process; here, a later second (in one second, the order would be a counter's)
    time.sleep(1.1)
    _run(tmp_path, steps=12, close=True)
    err = capsys.readouterr().err
    assert f"devplug: resumed from {tmp_path / 'ckpt' / 'step_0000008.pt'} (step 8, epoch 0)" in err
    expected = [(s, s + (100.0 if s > 8 else 0.0)) for s in range(1, 13)]

    with open(tmp_path / "logs" / "metrics.csv", newline="") as f:
        rows = [(int(r["step"]), float(r["value"])) for r in csv.DictReader(f) if r["name"] == "loss"]
    assert rows == expected
    records = [json.loads(line) for line in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["loss"]) for r in records if "loss" in r] == expected

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "logs"))
    events.Reload()
    board = [(e.step, e.value) for e in events.Scalars("train/loss")]
    assert Counter(step for step, _ in board) == Counter(range(1, 13))  # one curve: no overlapping steps
    assert sorted(board) == expected
