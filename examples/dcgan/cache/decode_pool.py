"""Decode a list of image files in worker processes that never outlive the process that started them.

A ``torch.utils.data.DataLoader`` over the files does the fan-out and keeps results in order. Its workers
are made to die with their parent whatever way the parent dies (a ``SIGKILL``, a crash, an exception):
on Linux each worker asks the kernel for ``SIGKILL`` when its parent goes (``prctl(PR_SET_PDEATHSIG)``),
and checks that the parent is still the one that started it (it may have died before the request).
Without this a worker whose results the dead parent no longer reads blocks forever writing into the
pipe. On an exception in the consumer the workers are shut down before it propagates.
"""

from __future__ import annotations

import ctypes
import functools
import os
import signal
import sys
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from devplug.toolkit import load_rgb, printable, stop_workers

PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int, _worker_id: int = 0) -> None:
    """In a worker: be killed when the parent exits; exit now if it already has (a ``worker_init_fn``)."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):  # no prctl: the parent-pid check below still catches the common case
            pass
    if os.getppid() != parent_pid:
        os._exit(1)


def decode_image(path: str | os.PathLike[str], image_size: int) -> np.ndarray:
    """One image as ``(3, S, S)`` uint8: short side resized to ``image_size``, center-cropped.

    Every pixel format becomes 8-bit RGB, EXIF orientation is applied, and large JPEGs are decoded at
    reduced scale (``Image.draft``); see `devplug.toolkit.load_rgb`.
    """
    return load_rgb(path, image_size).transpose(2, 0, 1).copy()


class _Decode(Dataset):
    """Item ``i``: ``(i, pixels or None, reason)`` for file ``i``: a file that fails is reported, not raised."""

    def __init__(self, paths: list[str], image_size: int, decode: Callable[[str, int], np.ndarray]) -> None:
        self.paths = paths
        self.image_size = image_size
        self.decode = decode

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> tuple[int, np.ndarray | None, str]:
        try:
            return index, self.decode(self.paths[index], self.image_size), ""
        except Exception as exc:  # any failure to decode one file: skip it and say why
            return index, None, printable(f"{type(exc).__name__}: {exc}").strip()


def _as_list(items: list[Any]) -> list[Any]:
    return items


def decode_files(
    paths: list[str],
    image_size: int,
    *,
    workers: int,
    chunk: int = 64,
    decode: Callable[[str, int], np.ndarray] = decode_image,
) -> Iterator[list[tuple[int, np.ndarray | None, str]]]:
    """Chunks of ``(index, (3, S, S) uint8 or None, reason)`` for ``paths``, in order, decoded in ``workers`` processes.

    ``workers=0`` decodes in this process. When the caller stops early or raises, the workers are shut
    down before control returns to it.
    """
    loader = DataLoader(
        _Decode([os.fspath(p) for p in paths], image_size, decode),
        batch_size=chunk,
        num_workers=workers,
        collate_fn=_as_list,
        # A private generator: decoding must not consume the training RNG (a run that builds the cache and
        # one that reuses it then train identically).
        generator=torch.Generator(),
        worker_init_fn=functools.partial(die_with_parent, os.getpid()) if workers else None,
        prefetch_factor=2 if workers else None,
    )
    iterator = iter(loader)
    try:
        yield from iterator
    finally:
        stop_workers(iterator)  # now, not at GC: the workers are gone when this returns
        del iterator

