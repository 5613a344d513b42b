"""A second training loader, shorter than the primary and iterated again whenever it runs out, resumes mid-pass.

The usual pattern for an auxiliary data set beside the main one: each time it runs out, the author starts a fresh
pass. A checkpoint saved on its second pass must resume at the sample that pass had reached, not past its end.
"""

from __future__ import annotations

import torch
from torch.utils.data import TensorDataset

import devplug


def build(seed: int = 0):
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False, seed=seed)
    torch.manual_seed(seed)
    model = trainer.setup(torch.nn.Linear(3, 1))
    opt = trainer.optimizer("sgd", model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(5)
    main = trainer.dataloader(TensorDataset(torch.randn(40, 3, generator=g)), batch_size=4, shuffle=True,
                              num_workers=0)  # 10 batches an epoch
    aux = trainer.dataloader(TensorDataset(torch.randn(12, 3, generator=g)), batch_size=4, shuffle=True,
                             num_workers=0)  # 3 batches a pass
    return trainer, model, opt, main, aux


def cycled(loader):
    while True:
        yield from loader  # a fresh pass each time the last one ran out


def train(trainer, model, opt, main, aux, *, max_steps: int | None = None) -> list[torch.Tensor]:
    seen = []
    extra = cycled(aux)
    for _ in trainer.epochs(2, max_steps=max_steps):
        for (x,) in main:
            (a,) = next(extra)
            seen.append(a)
            trainer.backward((model(x).mean() - model(a).mean()) ** 2)
            trainer.step(opt)
    return seen


def test_a_second_loader_on_its_second_pass_resumes_where_that_pass_was(tmp_path):
    full = build()
    everything = train(*full)
    first = build()
    train(*first, max_steps=5)  # the auxiliary loader is 2 batches into its second pass
    path = first[0].save(tmp_path / "ck.pt")
    resumed = build(seed=1)
    resumed[0].load(path)
    rest = train(*resumed)
    assert len(rest) == 15 and all(torch.equal(a, b) for a, b in zip(rest, everything[5:], strict=True))
    for a, b in zip(full[1].parameters(), resumed[1].parameters(), strict=True):
        assert torch.equal(a, b)


def test_a_loop_left_at_max_steps_and_entered_again_goes_on_in_every_training_loader():
    """``zip(main, aux)``: entered again after ``max_steps``, the epoch goes on in both loaders together, as an
    uninterrupted run (and a resume from a checkpoint saved there) does, not with ``aux`` from its start."""

    def pairs(trainer, main, aux, max_steps=None):
        seen = []
        for _ in trainer.epochs(1, max_steps=max_steps):
            for (x,), (a,) in zip(main, aux, strict=False):
                seen.append((x, a))
        return seen

    def beside(trainer):  # as long as the primary: 10 batches
        data = TensorDataset(torch.randn(40, 3, generator=torch.Generator().manual_seed(9)))
        return trainer.dataloader(data, batch_size=4, shuffle=True, num_workers=0)

    trainer, _model, _opt, main, _aux = build()
    aux = beside(trainer)
    everything = pairs(trainer, main, aux)
    again, _model, _opt, main, _aux = build()
    aux = beside(again)
    parts = pairs(again, main, aux, max_steps=3) + pairs(again, main, aux)
    assert len(parts) == len(everything) == 10
    assert all(torch.equal(x, y) for (x, _), (y, _) in zip(parts, everything, strict=True))  # the primary goes on
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(parts, everything, strict=True))


def test_a_pass_the_author_still_holds_goes_on_by_itself_when_the_loop_is_entered_again():
    """A shorter loader cycled by the author's generator: its pass is still open when the loop is left at
    ``max_steps``; entered again, that pass goes on, and its next pass starts at its first batch."""

    def run(trainer, main, extra, max_steps=None):
        seen = []
        for _ in trainer.epochs(1, max_steps=max_steps):
            for (_x,) in main:
                seen.append(next(extra)[0])
        return seen

    trainer, _model, _opt, main, aux = build()
    everything = run(trainer, main, cycled(aux))
    again, _model, _opt, main, aux = build()
    extra = cycled(aux)
    parts = run(again, main, extra, max_steps=5) + run(again, main, extra)
    assert len(parts) == len(everything) == 10
    assert all(torch.equal(a, b) for a, b in zip(parts, everything, strict=True))
