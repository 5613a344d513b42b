"""The batch a loader of unknown length looks ahead at, under gradient accumulation, is never lost.

To know whether a micro-batch is its epoch's last, the primary training loader of unknown length (a generator,
an IterableDataset) draws the next batch before handing out the current one. When the loop is left mid-epoch
(``max_steps``, a ``break``) that drawn batch must still be trained on: first on the loader's next pass, and a
checkpoint saved there resumes at it.
"""

from __future__ import annotations

import os
import signal

import pytest
import torch
from torch.utils.data import IterableDataset

import devplug

ITEMS = 12


def counted(handed: list[int]):
    """The author's generator of one-sample batches 0, 1, ...; ``handed`` records each one it gives out."""
    for i in range(ITEMS):
        handed.append(i)
        yield torch.tensor([[float(i)]])


class Counted(IterableDataset):
    """An IterableDataset of samples 0, 1, ... (a fresh pass each time); ``handed`` records each one it gives out."""

    def __init__(self, handed: list[int]) -> None:
        self.handed = handed

    def __iter__(self):
        for i in range(ITEMS):
            self.handed.append(i)
            yield torch.tensor([float(i)])


def _trainer(**options) -> tuple[devplug.Trainer, torch.nn.Module, torch.optim.Optimizer]:
    options.setdefault("stop_signals", ())
    trainer = devplug.Trainer(device="cpu", progress=False, loggers=[], count_flops=False, accumulate_grad_batches=2,
                              **options)
    model = trainer.setup(torch.nn.Linear(1, 1))
    return trainer, model, trainer.optimizer("sgd", model.parameters(), lr=0.0)


def _train(trainer, model, opt, loader, seen: list[int], *, epochs: int = 1, max_steps: int | None = None,
           leave_after: int | None = None) -> None:
    """Train on ``loader``, recording each sample trained on in ``seen``; ``leave_after``: break out of each epoch
    after that many batches of it."""
    for _epoch in trainer.epochs(epochs, max_steps=max_steps):
        for n, x in enumerate(loader, 1):
            seen.extend(int(v) for v in x.flatten().tolist())
            trainer.backward(model(x).sum())
            trainer.step(opt)
            if n == leave_after:
                break


@pytest.mark.parametrize("source", ["generator", "iterable dataset"])
def test_leaving_at_max_steps_then_going_on_trains_every_sample_once(source):
    handed: list[int] = []
    trainer, model, opt = _trainer()
    loader = trainer.dataloader(counted(handed) if source == "generator" else Counted(handed),
                                **({} if source == "generator" else {"batch_size": 1, "num_workers": 0}))
    seen: list[int] = []
    for limit in (3, 5, None):  # 6 micro-batches, then 4 more, then the rest
        _train(trainer, model, opt, loader, seen, max_steps=limit)
    assert seen == list(range(ITEMS)) and trainer.global_step == ITEMS // 2
    if source == "generator":  # one pass over the author's generator: all it handed out was trained on
        assert handed == seen


def test_a_break_out_of_an_epoch_hands_the_looked_ahead_batch_to_the_next_one():
    handed: list[int] = []
    trainer, model, opt = _trainer()
    loader = trainer.dataloader(counted(handed))
    seen: list[int] = []
    _train(trainer, model, opt, loader, seen, epochs=3, leave_after=4)  # each epoch: 4 batches (2 steps), break
    assert seen == handed == list(range(ITEMS)) and trainer.global_step == 6


@pytest.mark.parametrize("leave", ["max_steps", "stop signal"])
def test_a_checkpoint_saved_with_a_batch_looked_ahead_resumes_at_that_batch(tmp_path, leave):
    handed: list[int] = []
    trainer, model, opt = _trainer(stop_signals=("SIGUSR1",))
    loader = trainer.dataloader(counted(handed))
    seen: list[int] = []
    if leave == "max_steps":
        _train(trainer, model, opt, loader, seen, max_steps=3)
    else:
        for _epoch in trainer.epochs(1):
            for x in loader:
                seen.append(int(x.item()))
                trainer.backward(model(x).sum())
                trainer.step(opt)
                if len(seen) == 5:  # in the third step's window: the run stops once that step is done
                    os.kill(os.getpid(), signal.SIGUSR1)
        assert trainer.should_stop
    assert seen == list(range(6)) and handed == list(range(7))  # the 7th is drawn, looked ahead at
    trainer.save(tmp_path / "step3.pt")
    if leave == "max_steps":  # the same process goes on: the looked-ahead batch comes first
        _train(trainer, model, opt, loader, seen)
        assert seen == handed == list(range(ITEMS))

    # a new process: a fresh generator, the checkpoint skips the 6 samples trained on, no more, no fewer
    again: list[int] = []
    resumed, model, opt = _trainer()
    loader = resumed.dataloader(counted([]))
    assert resumed.resume(tmp_path / "step3.pt").step == 3
    _train(resumed, model, opt, loader, again)
    assert again == list(range(6, ITEMS)) and resumed.global_step == ITEMS // 2
