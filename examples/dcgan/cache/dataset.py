"""The cached images as a data set: ``(3, S, S)`` uint8 rows of an ``(N, 3, S, S)`` ``.npy`` file.

Batches stay uint8 until they reach the device (4× less to copy than float32); the training loop scales
them to [-1, 1] there. Rows are read with positional reads (``pread``) from a descriptor each process
opens, not through a memory map: a file truncated by another job while this one reads it is a short
read, reported as one `devplug.DataError` line, where a memory map would die of SIGBUS.
"""

from __future__ import annotations

import os
from typing import IO, Any

import numpy as np
import torch
from torch.utils.data import Dataset

from devplug import DataError


class CachedImages(Dataset):
    """The cached images as ``(uint8 tensor (3, S, S), label)``; the file is opened per process.

    ``lock`` is the cache file held open with a shared lock: while this object lives (in the process
    that prepared it), no other job's rebuild deletes the file. `close` releases it.
    """

    def __init__(self, path: str | os.PathLike[str], labels: list[int], lock: IO[bytes] | None = None) -> None:
        self.path = os.fspath(path)
        self.labels = labels
        self.lock = lock
        self._file: tuple[int, int, tuple[int, ...], int] | None = None  # fd, data offset, row shape, row bytes

    def __len__(self) -> int:
        return len(self.labels)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_file": None, "lock": None}  # workers open the file themselves

    def _opened(self) -> tuple[int, int, tuple[int, ...], int]:
        if self._file is None:
            fd = os.open(self.path, os.O_RDONLY)
            with open(self.path, "rb") as handle:  # the header: shape and where the rows start
                version = np.lib.format.read_magic(handle)
                read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                               else np.lib.format.read_array_header_2_0)
                shape, _fortran, _dtype = read_header(handle)
                offset = handle.tell()
            row = tuple(int(n) for n in shape[1:])
            self._file = (fd, offset, row, int(np.prod(row)))
        return self._file

    def _rows(self, indices: list[int]) -> np.ndarray:
        fd, offset, row, size = self._opened()
        out = np.empty((len(indices), size), dtype=np.uint8)
        for n, index in enumerate(indices):
            data = os.pread(fd, size, offset + index * size)
            if len(data) != size:
                now = os.fstat(fd).st_size
                raise DataError(f"the image cache {self.path!r} changed while this run was reading it (it now "
                                f"ends at {now:,} bytes, before image {index}); another job truncated or rebuilt "
                                "it: run again to rebuild it, or pass --no-cache")
            out[n] = np.frombuffer(data, dtype=np.uint8)
        return out.reshape((len(indices), *row))

    @property
    def array(self) -> np.ndarray:
        """Every cached image as one ``(N, 3, S, S)`` uint8 array, read into memory."""
        return self._rows(list(range(len(self.labels))))

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return torch.from_numpy(self._rows([index])[0]), self.labels[index]

    def __getitems__(self, indices: list[int]) -> list[tuple[torch.Tensor, int]]:
        """A batch at once: the rows read in index order into one array."""
        pixels = torch.from_numpy(self._rows([int(i) for i in indices]))
        return list(zip(pixels, (self.labels[i] for i in indices), strict=False))

    def close(self) -> None:
        """Close the file and release the lock (another job may then remove a stale version)."""
        if self._file is not None:
            os.close(self._file[0])
            self._file = None
        if self.lock is not None:
            self.lock.close()
            self.lock = None
