"""close() reports what was logged since the last log point, as leaving epochs() does."""

from __future__ import annotations

import json

import torch

import devplug


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_value_logged_after_the_loop_reaches_the_loggers_at_close(tmp_path):
    trainer = devplug.Trainer(device="cpu", progress=False, log_dir=str(tmp_path), loggers=["jsonl"], log_every=5)
    model = trainer.setup(torch.nn.Linear(3, 1))
    opt = trainer.optimizer("sgd", model.parameters(), lr=0.1)
    batches = [(torch.full((4, 3), float(i)),) for i in range(3)]
    for _ in trainer.epochs(1):
        for (x,) in trainer.dataloader(batches):
            trainer.backward(model(x).sum())
            trainer.step(opt)
    trainer.log(test_loss=torch.tensor(0.25))  # not an evaluation name: pending until a report
    trainer.close()
    points = [p for p in _lines(tmp_path / "metrics.jsonl") if "test_loss" in p]
    assert [(p["step"], p["test_loss"]) for p in points] == [(3, 0.25)]


def test_close_with_nothing_pending_writes_no_extra_point(tmp_path):
    with devplug.Trainer(device="cpu", progress=False, log_dir=str(tmp_path), loggers=["jsonl"]) as trainer:
        trainer.log(loss=torch.tensor(1.0))
        assert trainer.flush_logs() == {"loss": 1.0}
    assert [p for p in _lines(tmp_path / "metrics.jsonl") if "step" in p] == [{"step": 0, "loss": 1.0}]
