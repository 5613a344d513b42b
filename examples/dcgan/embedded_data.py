"""The embedded default data set: colored shapes on gradients, drawn on the fly a batch at a time, no download.

Each image is a two-color linear gradient in a random direction with one bright disc or square on it
(soft-edged, random color, size and place). Image ``i`` is a pure function of ``(seed, i)``, so every
epoch, every rank and every resumed run sees the same pictures. A DCGAN learns this distribution in a
few minutes on a laptop CPU: smooth backgrounds come first, then a crisp shape on them. The loader asks
for a whole batch at once (``__getitems__``), drawn with array operations over the batch: about 0.1 ms per
32×32 image on a 2-core CPU, little enough that the loader needs no worker process.

Also here: `FakeImages` for ``--data fake`` (compute-only runs: a small pool of random images
reused, so no time is spent producing data).
"""

from __future__ import annotations

import colorsys

import numpy as np
import torch
from torch.utils.data import Dataset

#: Images per epoch of the embedded data set.
SHAPES_LENGTH = 32_000
#: Images per epoch of ``--data fake``.
FAKE_LENGTH = 32_000


class ShapesDataset(Dataset):
    """Procedural colored shapes on gradients: ``(uint8 image (3, S, S), label)``; label 0 disc, 1 square."""

    #: Uniform draws per image: gradient colors (6), direction, shape, hue, saturation, value, size, x, y.
    DRAWS = 14

    def __init__(self, image_size: int, length: int = SHAPES_LENGTH, seed: int = 0) -> None:
        self.image_size = image_size
        self.length = length
        self.seed = seed
        axis = (np.arange(image_size, dtype=np.float32) + 0.5) / image_size
        self._y, self._x = np.meshgrid(axis, axis, indexing="ij")
        # Every image's random choices, drawn up front as row i of one stream seeded by ``seed`` (the
        # stream fills the table row by row, so row i does not depend on ``length``): 56 bytes per image.
        self._draws = np.random.default_rng(seed).random((length, self.DRAWS), dtype=np.float32)

    def __len__(self) -> int:
        return self.length

    def render_many(self, indices: list[int]) -> tuple[np.ndarray, list[int]]:
        """Images ``indices`` as one NHWC float32 array in [0, 1], and their labels.

        Vectorised over the batch: a batch costs a few array operations, not a few per image, so the
        loader keeps up with the training step from the main process and leaves every core to compute.
        """
        index = np.asarray(indices, dtype=np.int64)
        if index.size and (index.min() < 0 or index.max() >= self.length):
            raise IndexError(f"index out of range for {self.length} images: {list(indices)}")
        u = self._draws[index].T
        # Background: a muted two-color gradient in a random direction.
        low, high = 0.05 + 0.5 * u[0:3].T, 0.05 + 0.5 * u[3:6].T
        angle = 2 * np.pi * u[6]
        # Foreground: one bright, saturated disc or square, soft-edged, wholly inside the image.
        label = (u[7] < 0.5).astype(np.int64)
        color = np.array([colorsys.hsv_to_rgb(h, 0.6 + 0.4 * s, 0.8 + 0.2 * v)
                          for h, s, v in zip(u[8], u[9], u[10], strict=True)], dtype=np.float32).reshape(-1, 3)
        radius = 0.12 + 0.14 * u[11]
        cx = 0.05 + radius + (0.9 - 2 * radius) * u[12]
        cy = 0.05 + radius + (0.9 - 2 * radius) * u[13]
        per_image = (slice(None), None, None)  # broadcast a value per image over (H, W)
        x, y = self._x[None], self._y[None]
        t = (x - 0.5) * np.cos(angle)[per_image] + (y - 0.5) * np.sin(angle)[per_image]
        t_min, t_max = t.min(axis=(1, 2))[per_image], t.max(axis=(1, 2))[per_image]
        t = (t - t_min) / np.maximum(t_max - t_min, 1e-6)
        image = low[:, None, None, :] + (high - low)[:, None, None, :] * t[..., None]
        dx, dy = np.abs(x - cx[per_image]), np.abs(y - cy[per_image])
        distance = np.where(label[per_image] == 0, np.sqrt(dx * dx + dy * dy), np.maximum(dx, dy))
        alpha = np.clip((radius[per_image] - distance) * self.image_size + 0.5, 0.0, 1.0)[..., None]
        image += (color[:, None, None, :] - image) * alpha
        return image, label.tolist()

    def render(self, index: int) -> tuple[np.ndarray, int]:
        """Image ``index`` as an HWC float32 array in [0, 1], and its label."""
        images, labels = self.render_many([index])
        return images[0], labels[0]

    def __getitems__(self, indices: list[int]) -> list[tuple[torch.Tensor, int]]:
        """A batch of samples at once (how torch's DataLoader asks a data set that offers it)."""
        images, labels = self.render_many(indices)
        pixels = torch.from_numpy(np.ascontiguousarray((images * 255 + 0.5).astype(np.uint8).transpose(0, 3, 1, 2)))
        return list(zip(pixels, labels, strict=True))

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.__getitems__([index])[0]


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
