"""The run's summary: printed once (rank 0), with the reason for each automatic choice; one final progress line."""

from __future__ import annotations

import attrs
import pytest
import torch

import devplug


def _trainer(**options) -> devplug.Trainer:
    options = {"device": "cpu", "progress": False, "loggers": [], "stop_signals": (), "count_flops": False,
               **options}
    return devplug.Trainer(**options)


def test_printing_the_summary_shows_the_table_on_rank_0_only_unless_asked_for_every_rank():
    trainer = _trainer(precision="32-true")
    table = str(trainer.summary())
    assert table.startswith("device") and "precision" in table
    trainer._launch = attrs.evolve(trainer._launch, rank=1)  # the same trainer seen as rank 1 of a job
    assert str(trainer.summary()) == ""  # print(trainer.summary()) on every rank: one table, rank 0's
    assert trainer.summary()["steps"] == 0  # the values are there on every rank
    assert str(trainer.summary(all_ranks=True)).startswith("device")


def test_the_summary_says_why_auto_chose_the_device_and_precision(monkeypatch):
    monkeypatch.delenv("DEVPLUG_DEVICE", raising=False)
    trainer = _trainer(device="auto", precision="auto")
    reasons = trainer.summary()["reasons"]
    assert reasons["device"].startswith(f"'auto' chose {trainer.device.spec.name}: the available device")
    assert reasons["precision"].startswith("'auto' chose ") and "bf16" in reasons["precision"]
    assert "precision" not in _trainer(precision="32-true").summary()["reasons"]  # the author chose


def test_the_final_progress_line_is_printed_once(capsys):
    trainer = _trainer(precision="32-true", progress=True, log_every=5)
    model = trainer.setup(torch.nn.Linear(2, 1))
    opt = trainer.optimizer("sgd", model.parameters(), lr=0.1)
    loader = trainer.dataloader(torch.utils.data.TensorDataset(torch.randn(10, 2)), 1, num_workers=0)
    for _ in trainer.epochs(2):
        for (x,) in loader:
            trainer.backward(model(x).sum())
            trainer.step(opt)
            trainer.log(loss=model(x).sum())
        trainer.log(val_loss=torch.tensor(1.0))
    trainer.close()
    err = capsys.readouterr().err
    assert err.count("20/20") == 1, err
    assert "val_loss 1" in err.split("20/20")[1]  # the line shown last holds the last evaluation


@pytest.mark.parametrize("precision", ["auto"])
def test_the_summary_table_shows_the_reasons(precision):
    assert "reasons.precision" in str(_trainer(precision=precision).summary())


def test_the_progress_bar_ends_full_when_the_epochs_end_before_max_steps(capsys):
    # max_steps is a limit: with fewer steps in the epochs asked for, the bar's total is those steps
    trainer = _trainer(precision="32-true", progress=True, log_every=5)
    model = trainer.setup(torch.nn.Linear(2, 1))
    opt = trainer.optimizer("sgd", model.parameters(), lr=0.1)
    loader = trainer.dataloader(torch.utils.data.TensorDataset(torch.randn(10, 2)), 1, num_workers=0)
    for _ in trainer.epochs(2, max_steps=1000):
        for (x,) in loader:
            trainer.backward(model(x).sum())
            trainer.step(opt)
            trainer.log(loss=model(x).sum())
    trainer.close()
    err = capsys.readouterr().err
    assert "20/20" in err and "/1000" not in err, err
