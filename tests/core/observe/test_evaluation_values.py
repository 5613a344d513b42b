"""Evaluation values reach every tracker as logged; training values keep their averaging between log points.

The README loop logs ``val_accuracy`` once per epoch, after the training loader's loop; with ``log_every=50``
and 13-step epochs a log point falls only every few epochs, and the final accuracy must still be what each
tracker and ``last_metrics`` end with, not a mean over epochs.
"""

from __future__ import annotations

import csv
import json

import pytest
import torch

import devplug

ACCURACY = [0.5, 0.6, 0.65, 0.715]  # one per epoch; the last is the model's final accuracy
STEPS = 13


def _tensorboard(log_dir) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def _csv(path, name: str) -> list[tuple[int, float]]:
    with open(path, newline="") as f:
        return [(int(r["step"]), float(r["value"])) for r in csv.DictReader(f) if r["name"] == name]


def _jsonl(path, name: str) -> list[tuple[int, float]]:
    records = [json.loads(line) for line in open(path).read().splitlines()]
    return [(r["step"], r[name]) for r in records if "step" in r and name in r]


def _readme_loop(tmp_path, every: int | None = None, loggers: tuple[str, ...] = ("tensorboard", "csv", "jsonl")
                 ) -> tuple[devplug.Trainer, list[float]]:
    pytest.importorskip("tensorboard")
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False, log_every=50, count_flops=False,
                              log_dir=str(tmp_path), loggers=list(loggers), stop_signals=())
    model = trainer.setup(torch.nn.Linear(2, 1))
    opt = trainer.optimizer("sgd", model.parameters(), lr=0.0)
    loader = trainer.dataloader(torch.utils.data.TensorDataset(torch.randn(STEPS, 2)), 1, num_workers=0)
    losses: list[float] = []
    for epoch in trainer.epochs(len(ACCURACY)):
        for (x,) in loader:
            trainer.backward(model(x).sum())
            trainer.step(opt)
            losses.append(float(trainer.global_step))
            trainer.log(loss=torch.tensor(float(trainer.global_step)))
            if every is not None and trainer.global_step % every == 0:
                trainer.log(val_loss=torch.tensor(1.0 / trainer.global_step))  # an evaluation inside the loop
        trainer.log(val_accuracy=torch.tensor(ACCURACY[epoch]))  # after the epoch's training batches
    trainer.close()
    return trainer, losses


def test_the_readme_loops_final_accuracy_is_what_every_tracker_and_last_metrics_end_with(tmp_path):
    trainer, _ = _readme_loop(tmp_path)
    expected = [(STEPS * (e + 1), pytest.approx(a, abs=1e-6)) for e, a in enumerate(ACCURACY)]
    assert _tensorboard(tmp_path)["eval/accuracy"] == expected
    assert _csv(tmp_path / "metrics.csv", "val_accuracy") == expected
    assert _jsonl(tmp_path / "metrics.jsonl", "val_accuracy") == expected
    assert trainer.last_metrics["val_accuracy"] == pytest.approx(ACCURACY[-1], abs=1e-6)
    assert trainer.summary()["evaluation"] == {"val_accuracy": pytest.approx(ACCURACY[-1], abs=1e-6)}


def test_training_values_keep_their_averaging_between_log_points(tmp_path):
    trainer, losses = _readme_loop(tmp_path)
    board = dict(_tensorboard(tmp_path)["train/loss"])
    assert board[50] == pytest.approx(sum(losses[:50]) / 50)  # the mean since the previous log point
    assert board[52] == pytest.approx((51 + 52) / 2)  # the rest, reported when epochs() ends
    assert trainer.last_metrics["loss"] == pytest.approx(51.5)


def test_an_evaluation_value_logged_inside_the_loop_is_written_at_its_step(tmp_path):
    _readme_loop(tmp_path, every=5)
    expected = [(s, pytest.approx(1.0 / s)) for s in range(5, STEPS * len(ACCURACY) + 1, 5)]
    assert _csv(tmp_path / "metrics.csv", "val_loss") == expected
    assert _tensorboard(tmp_path)["eval/loss"] == expected


def test_mlflow_gets_each_epochs_accuracy_at_its_step(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    trainer, _ = _readme_loop(tmp_path, loggers=("mlflow",))
    client = MlflowClient(tracking_uri=trainer._reporter.loggers[0].tracking_uri)
    [run] = client.search_runs([e.experiment_id for e in client.search_experiments()])
    history = client.get_metric_history(run.info.run_id, "val_accuracy")
    assert sorted((m.step, m.value) for m in history) == [
        (STEPS * (e + 1), pytest.approx(a, abs=1e-6)) for e, a in enumerate(ACCURACY)]


def test_wandb_gets_each_epochs_accuracy_at_its_step(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb", reason="the wandb extra is not installed (pip install 'devplug[wandb]')")
    from test_tracking import _wandb_history, _wandb_records

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    _readme_loop(tmp_path, loggers=("wandb",))
    wandb.teardown()  # the W&B service writes the run file completely when it stops
    accuracy = {step: values["eval/accuracy"] for step, values in _wandb_history(_wandb_records(tmp_path))
                if "eval/accuracy" in values}
    assert sorted(accuracy.items()) == [(STEPS * (e + 1), pytest.approx(a, abs=1e-6)) for e, a in enumerate(ACCURACY)]
