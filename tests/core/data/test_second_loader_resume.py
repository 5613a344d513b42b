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
