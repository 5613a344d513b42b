"""The cached images as a data set: slices of a memory-mapped ``(N, 3, S, S)`` uint8 file.

Batches stay uint8 until they reach the device (4× less to copy than float32); the training loop scales
them to [-1, 1] there.
"""

from __future__ import annotations

import os
from typing import IO, Any

import numpy as np
import torch
from torch.utils.data import Dataset


class CachedImages(Dataset):
    """The cached images as ``(uint8 tensor (3, S, S), label)``; the memory map is opened per process.

    ``lock`` is the cache file held open with a shared lock: while this object lives (in the process
    that prepared it), no other job's rebuild deletes the file. `close` releases it.
    """

    def __init__(self, path: str | os.PathLike[str], labels: list[int], lock: IO[bytes] | None = None) -> None:
        self.path = os.fspath(path)
        self.labels = labels
        self.lock = lock
        self._array: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.labels)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_array": None, "lock": None}  # workers map the file themselves

    @property
    def array(self) -> np.ndarray:
        """The memory-mapped ``(N, 3, S, S)`` uint8 array."""
        if self._array is None:
            self._array = np.load(self.path, mmap_mode="r")
        return self._array

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return torch.from_numpy(np.array(self.array[index])), self.labels[index]

    def __getitems__(self, indices: list[int]) -> list[tuple[torch.Tensor, int]]:
        """A batch at once: one gather from the memory map instead of one read per image."""
        pixels = torch.from_numpy(self.array[np.asarray(indices, dtype=np.int64)])
        return list(zip(pixels, (self.labels[i] for i in indices), strict=False))

    def close(self) -> None:
        """Unmap the file and release the lock (another job may then remove a stale version)."""
        self._array = None
        if self.lock is not None:
            self.lock.close()
            self.lock = None
