"""The embedded default data set: colored shapes on gradients, drawn on the fly, no download.

Each image is a two-color linear gradient in a random direction with one bright disc or square on it
(soft-edged, random color, size and place). Image ``i`` is a pure function of ``(seed, i)``, so every
epoch, every rank and every resumed run sees the same pictures. A DCGAN learns this distribution in a
few minutes on a laptop CPU: smooth backgrounds come first, then a crisp shape on them.

Drawing is cheap enough to stay in the training process: ``DataLoader`` asks for a whole batch at once
(:meth:`ShapesDataset.__getitems__`), and the batch is drawn with NumPy array arithmetic over all its
images, its random numbers from a counter-based hash of ``(seed, index)`` (no generator object per
image). About 2 ms a batch of 64 at 32×32 on a 2-core VM, where drawing image by image with a NumPy
generator each took 21 ms — a tenth of the DCGAN step there, which loading in the step's process or in
a worker sharing its cores cost every batch.

Also here: :class:`FakeImages` for ``--data fake`` (compute-only runs: a small pool of random images
reused, so no time is spent producing data).
"""

from __future__ import annotations

import colorsys
import math
from collections.abc import Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

#: Images per epoch of the embedded data set.
SHAPES_LENGTH = 32_000
#: Images per epoch of ``--data fake``.
FAKE_LENGTH = 32_000

#: Random numbers drawn per image (see :meth:`ShapesDataset.draw`).
_DRAWS = 14


def _mix(z: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer on uint64 arrays (wrapping arithmetic): consecutive inputs give unrelated outputs."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def uniforms(seed: int, indices: np.ndarray, count: int) -> np.ndarray:
    """``(len(indices), count)`` floats in [0, 1) hashed from ``(seed, index, k)``: the same however batched."""
    with np.errstate(over="ignore"):
        key = _mix(np.array([seed & (2**64 - 1)], dtype=np.uint64) + np.uint64(0x9E3779B97F4A7C15))
        counters = indices.astype(np.uint64)[:, None] * np.uint64(count) + np.arange(count, dtype=np.uint64)
        bits = _mix(_mix(counters + np.uint64(0x9E3779B97F4A7C15)) ^ key)
    return (bits >> np.uint64(11)).astype(np.float64) * 2.0**-53


class ShapesDataset(Dataset):
    """Procedural colored shapes on gradients: ``(uint8 image (3, S, S), label)``; label 0 disc, 1 square."""

    def __init__(self, image_size: int, length: int = SHAPES_LENGTH, seed: int = 0) -> None:
        self.image_size = image_size
        self.length = length
        self.seed = seed
        axis = (np.arange(image_size, dtype=np.float32) + 0.5) / image_size
        self._y, self._x = np.meshgrid(axis, axis, indexing="ij")

    def __len__(self) -> int:
        return self.length

    def draw(self, indices: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """Images ``indices`` as an ``(N, 3, S, S)`` float32 array in [0, 1], and their labels.

        Every value is computed element by element from the image's own random numbers, so an image is
        the same bit for bit whether drawn alone or in a batch.
        """
        index = np.asarray(indices, dtype=np.int64).reshape(-1)
        if index.size and (index.min() < 0 or index.max() >= self.length):
            bad = int(index[(index < 0) | (index >= self.length)][0])
            raise IndexError(f"index {bad} out of range for {self.length} images")
        u = uniforms(self.seed, index, _DRAWS)
        per_image = (slice(None), None, None)
        # Background: a muted two-color gradient in a random direction.
        low = (0.05 + 0.5 * u[:, 0:3]).astype(np.float32)[:, :, None, None]
        high = (0.05 + 0.5 * u[:, 3:6]).astype(np.float32)[:, :, None, None]
        angle = 2 * math.pi * u[:, 6]
        cos = np.array([math.cos(a) for a in angle], np.float32)[per_image]  # libm per image: batch-independent
        sin = np.array([math.sin(a) for a in angle], np.float32)[per_image]
        x, y = self._x, self._y
        t = (x - np.float32(0.5)) * cos + (y - np.float32(0.5)) * sin
        t_min, t_max = t.min(axis=(1, 2), keepdims=True), t.max(axis=(1, 2), keepdims=True)
        t = (t - t_min) / np.maximum(t_max - t_min, np.float32(1e-6))
        image = low + (high - low) * t[:, None]
        # Foreground: one bright, saturated disc or square.
        labels = (u[:, 7] >= 0.5).astype(np.int64)
        color = np.array([colorsys.hsv_to_rgb(h, 0.6 + 0.4 * s, 0.8 + 0.2 * v) for h, s, v in u[:, 8:11]],
                         np.float32).reshape(-1, 3)[:, :, None, None]
        radius = 0.12 + 0.14 * u[:, 11]
        cx = (0.05 + radius + (0.9 - 2 * radius) * u[:, 12]).astype(np.float32)[per_image]
        cy = (0.05 + radius + (0.9 - 2 * radius) * u[:, 13]).astype(np.float32)[per_image]
        dx, dy = x - cx, y - cy
        distance = np.where((labels == 0)[per_image], np.sqrt(dx * dx + dy * dy), np.maximum(np.abs(dx), np.abs(dy)))
        edge = (radius.astype(np.float32)[per_image] - distance) * np.float32(self.image_size) + np.float32(0.5)
        alpha = np.clip(edge, np.float32(0.0), np.float32(1.0))[:, None]  # 1-pixel soft edge
        image += (color - image) * alpha
        return image, labels

    def render(self, index: int) -> tuple[np.ndarray, int]:
        """Image ``index`` as an HWC float32 array in [0, 1], and its label."""
        images, labels = self.draw([index])
        return images[0].transpose(1, 2, 0), int(labels[0])

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.__getitems__([index])[0]

    def __getitems__(self, indices: Sequence[int]) -> list[tuple[torch.Tensor, int]]:
        """Items ``indices`` (what ``DataLoader`` asks for a batch at once): equal to ``[self[i] for i in indices]``."""
        images, labels = self.draw(indices)
        pixels = torch.from_numpy((images * 255 + 0.5).astype(np.uint8))
        return [(pixels[n], int(labels[n])) for n in range(len(labels))]


class FakeImages(Dataset):
    """``--data fake``: random uint8 images from a small pool, for runs that measure compute only."""

    POOL = 256

    def __init__(self, image_size: int, length: int = FAKE_LENGTH, seed: int = 0) -> None:
        self.length = length
        generator = torch.Generator().manual_seed(seed)
        self.pool = torch.randint(0, 256, (self.POOL, 3, image_size, image_size), dtype=torch.uint8,
                                  generator=generator)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if not 0 <= index < self.length:
            raise IndexError(f"index {index} out of range for {self.length} images")
        return self.pool[index % self.POOL], 0
