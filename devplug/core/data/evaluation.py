"""How an evaluation loader splits its dataset over ranks: every sample exactly once, no padding.

The model devplug follows (docs/trainer.md, "Evaluation under several processes"):

- an **evaluation loader** (``Trainer.dataloader(..., train=False)``) yields its whole dataset *across the
  job*: each rank reads one contiguous block of it, the blocks are disjoint, they cover the dataset, and
  nothing is repeated to even them out (1,001 samples on 2 ranks: 501 + 500). A training loader's
  ``DistributedSampler`` pads instead, so that every rank runs the same number of steps; counted in a
  metric, a padded sample is counted twice.
- the **author reduces** what the ranks computed, with the Trainer's collectives: ``trainer.all_reduce``
  (sums, counts) and ``trainer.gather`` (per-sample outputs, uneven sizes allowed). On one process both
  are the identity, so the same loop is right on 1 and on N processes.

Contiguous blocks rather than every ``W``-th sample, so that ``trainer.gather`` of outputs collected over
the whole pass concatenates them in the dataset's order (unshuffled), as one process would produce them.
Block sizes differ by at most one sample, so ranks may run a different number of evaluation batches:
collectives belong after the evaluation pass, not inside it.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import Sampler


def evaluation_shard(count: int, rank: int, world_size: int) -> range:
    """The positions rank ``rank`` of ``world_size`` evaluates among ``count``: one contiguous block.

    Blocks are disjoint, cover ``range(count)`` exactly once, appear in rank order, and differ in
    length by at most one (the first ``count % world_size`` ranks hold one more). A rank may get an
    empty block when ``count < world_size``.
    """
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in a world of size {world_size}")
    base, extra = divmod(count, world_size)
    start = rank * base + min(rank, extra)
    return range(start, start + base + (1 if rank < extra else 0))


class EvaluationSampler(Sampler[int]):
    """This rank's block of a dataset of ``count`` samples (see `evaluation_shard`), unpadded.

    With ``shuffle`` the dataset is first permuted (seeded with ``seed + epoch``, the same permutation on
    every rank), then split: still every sample exactly once. ``set_epoch`` is called by the loader each
    epoch, like a ``DistributedSampler``'s.
    """

    def __init__(self, count: int, *, rank: int = 0, world_size: int = 1, shuffle: bool = False,
                 seed: int = 0) -> None:
        self.count = count
        self.rank = rank
        self.world_size = world_size
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self._block = evaluation_shard(count, rank, world_size)

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch``'s permutation (with ``shuffle``); the split itself never changes."""
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self._block)

    def __iter__(self) -> Iterator[int]:
        if not self.shuffle:
            return iter(self._block)
        order = torch.randperm(self.count, generator=torch.Generator().manual_seed(self.seed + self.epoch))
        return iter(order[self._block.start : self._block.stop].tolist())
