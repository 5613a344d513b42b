"""A toy model, data and loop shared by the tests of the Trainer, its loggers and its measurements."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import TensorDataset

import devplug


def make_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def make_data(n: int = 48) -> TensorDataset:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, 6, generator=g)
    return TensorDataset(x, x.sum(dim=1, keepdim=True).sin())


def train_toy(trainer: devplug.Trainer, *, steps: int, epochs: int = 1) -> None:
    """A few SGD steps of ``make_model`` on ``make_data(64)`` through ``trainer``, logging the loss each step."""
    model = trainer.setup(make_model())
    opt = trainer.optimizer("sgd", model.parameters(), lr=0.01)
    loader = trainer.dataloader(make_data(64), batch_size=4, num_workers=0)
    for _ in trainer.epochs(epochs, max_steps=steps):
        for x, y in loader:
            with trainer.autocast():
                loss = torch.nn.functional.mse_loss(model(x), y)
            trainer.backward(loss)
            trainer.step(opt)
            trainer.log(loss=loss)


class SyncCounter:
    """Counts host reads of tensor values (`.item()`, `.cpu()`, `.tolist()`, `float()`)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        for name in ("item", "cpu", "tolist", "__float__", "numpy"):
            original = getattr(torch.Tensor, name)

            def counting(tensor, *args, _original=original, **kwargs):
                self.count += 1
                return _original(tensor, *args, **kwargs)

            monkeypatch.setattr(torch.Tensor, name, counting)
