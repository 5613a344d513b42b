"""An author's DataLoader built with ``batch_sampler=BatchSampler(RandomSampler(...))`` resumes mid-epoch exactly.

torch then gives the loader a dummy ``SequentialSampler`` as ``loader.sampler``; the order comes from the batch
sampler's own sampler, which is the one devplug must seed each epoch (and judge for a replayable order).
"""

from __future__ import annotations

import logging

import torch
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, TensorDataset

import devplug
from devplug.core.data.device_loader import own_loader_choice, reproducible_order


def build(seed: int = 0):
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False, seed=seed)
    data = TensorDataset(torch.arange(40.0).view(40, 1))
    loader = trainer.dataloader(DataLoader(data, batch_sampler=BatchSampler(RandomSampler(data), 4, False)))
    return trainer, loader


def seen(trainer, loader, max_steps=None):
    out = []
    for _ in trainer.epochs(2, max_steps=max_steps):
        for (x,) in loader:
            out.append(x.flatten().tolist())
    return out


def test_a_batch_sampler_over_a_random_sampler_resumes_at_the_same_samples(tmp_path, caplog):
    everything = seen(*build())
    first, loader = build()
    seen(first, loader, max_steps=13)
    path = first.save(tmp_path / "ck.pt")
    torch.manual_seed(123)  # the resumed process's global random state is its own
    resumed, loader = build(seed=1)
    resumed.load(path)
    with caplog.at_level(logging.WARNING, logger="devplug"):
        rest = seen(resumed, loader)
    assert rest == everything[13:] and "may differ" not in caplog.text


class Buckets:
    """A batch sampler of the author's own, random and without set_epoch."""

    def __iter__(self):
        return iter(torch.randperm(8).view(2, 4).tolist())

    def __len__(self) -> int:
        return 2


def test_a_batch_sampler_of_the_authors_without_set_epoch_is_named_as_not_replayable():
    data = TensorDataset(torch.arange(8.0))
    choice = own_loader_choice(DataLoader(data, batch_sampler=Buckets()), None)
    assert "Buckets" in reproducible_order(choice)


def test_an_iterable_datasets_loader_is_named_for_what_it_is_when_its_order_cannot_be_replayed():
    from devplug.core.contract.records import LoaderChoice

    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(range(8))

    for sampler in (None, torch.utils.data.DataLoader(Stream()).sampler):  # devplug's own loader; the author's
        why = reproducible_order(LoaderChoice(loader=torch.utils.data.DataLoader(Stream(), batch_size=2),
                                              implementation="torch DataLoader", sampler=sampler))
        assert why == "its dataset, an IterableDataset (Stream), may yield other samples when iterated again"
