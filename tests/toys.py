"""A toy model, data and loop shared by the tests of the Trainer, its loggers and its measurements."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

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


class Clock:
    """A seconds clock the test moves by hand (``clock.now += 1.0``)."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def train_on_a_clock(trainer: devplug.Trainer, clock: Clock, *, samples: int = 40) -> None:
    """One epoch of ``Linear(4, 1)`` on ``samples`` random rows in batches of 4, each step one second of ``clock``."""
    model = trainer.setup(torch.nn.Linear(4, 1))
    opt = trainer.optimizer("sgd", model.parameters(), lr=0.1)
    loader = trainer.dataloader(TensorDataset(torch.randn(samples, 4)), batch_size=4, num_workers=0)
    for _ in trainer.epochs(1):
        for (x,) in loader:
            clock.now += 1.0  # each step's work
            trainer.backward(model(x).square().mean())
            trainer.step(opt)


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


def byte_windows(steps: int, context: int, *, batch: int = 16) -> Iterator[torch.Tensor]:
    """``steps`` batches of ``batch`` windows of ``context + 1`` bytes, cut at seeded random places from a seeded
    random text over a small alphabet (learnable in a few steps)."""
    generator = torch.Generator().manual_seed(1)
    text = torch.randint(0, 64, (4096,), generator=generator)
    for _ in range(steps):
        starts = torch.randint(0, len(text) - context - 1, (batch,), generator=generator)
        yield torch.stack([text[s:s + context + 1] for s in starts.tolist()])


def train_next_byte(trainer: devplug.Trainer, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    windows: Iterable[torch.Tensor]) -> list[float]:
    """One step of next-byte prediction per batch of ``windows`` (moved to the trainer's device); the losses."""
    losses = []
    for window in windows:
        window = trainer.to_device(window)
        with trainer.autocast():
            logits = model(window[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), window[:, 1:].flatten())
        trainer.backward(loss)
        trainer.step(optimizer)
        losses.append(float(loss.detach()))
    return losses


def train_byte_lm(trainer: devplug.Trainer, spec: object, steps: int, *, resume: object = None,
                  save: object = None) -> tuple[list[float], torch.nn.Module]:
    """The LM example's ``LanguageModel(spec)`` set up on ``trainer`` with AdamW, resumed from ``resume`` if given,
    trained ``steps`` steps on `byte_windows`, saved to ``save`` if given: the losses and the model."""
    from lm.models import LanguageModel  # examples/lm

    model = trainer.setup(LanguageModel(spec), name="lm")
    optimizer = trainer.optimizer("adamw", model.parameters(), lr=3e-3)
    if resume is not None:
        trainer.load(resume)
    losses = train_next_byte(trainer, model, optimizer, byte_windows(steps, spec.context))  # type: ignore[attr-defined]
    if save is not None:
        trainer.save(save)
    return losses, model
