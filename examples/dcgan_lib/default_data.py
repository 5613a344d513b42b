"""The embedded default data set: colored shapes on gradients, drawn on the fly, no download.

Each image is a two-color linear gradient in a random direction with one bright disc or square on it
(soft-edged, random color, size and place). Image ``i`` is a pure function of ``(seed, i)``, so every
epoch, every rank and every resumed run sees the same pictures. A DCGAN learns this distribution in a
few minutes on a laptop CPU: smooth backgrounds come first, then a crisp shape on them.

Also here: :class:`FakeImages` for ``--data fake`` (compute-only runs: a small pool of random images
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

    def __init__(self, image_size: int, length: int = SHAPES_LENGTH, seed: int = 0) -> None:
        self.image_size = image_size
        self.length = length
        self.seed = seed
        axis = (np.arange(image_size, dtype=np.float32) + 0.5) / image_size
        self._y, self._x = np.meshgrid(axis, axis, indexing="ij")

    def __len__(self) -> int:
        return self.length

    def render(self, index: int) -> tuple[np.ndarray, int]:
        """Image ``index`` as an HWC float32 array in [0, 1], and its label."""
        if not 0 <= index < self.length:
            raise IndexError(f"index {index} out of range for {self.length} images")
        rng = np.random.default_rng((self.seed, index))
        x, y = self._x, self._y
        # Background: a muted two-color gradient in a random direction.
        low, high = rng.uniform(0.05, 0.55, size=(2, 3)).astype(np.float32)
        angle = rng.uniform(0, 2 * np.pi)
        t = (x - 0.5) * np.cos(angle) + (y - 0.5) * np.sin(angle)
        t = (t - t.min()) / max(float(t.max() - t.min()), 1e-6)
        image = low + (high - low) * t[..., None]
        # Foreground: one bright, saturated disc or square.
        label = int(rng.integers(0, 2))
        color = np.array(colorsys.hsv_to_rgb(rng.uniform(), rng.uniform(0.6, 1.0), rng.uniform(0.8, 1.0)),
                         dtype=np.float32)
        radius = rng.uniform(0.12, 0.26)
        cx, cy = rng.uniform(0.05 + radius, 0.95 - radius, size=2)
        distance = np.hypot(x - cx, y - cy) if label == 0 else np.maximum(abs(x - cx), abs(y - cy))
        alpha = np.clip((radius - distance) * self.image_size + 0.5, 0.0, 1.0)[..., None]  # 1-pixel soft edge
        image = image * (1 - alpha) + color * alpha
        return image, label

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        image, label = self.render(index)
        pixels = np.ascontiguousarray((image * 255 + 0.5).astype(np.uint8).transpose(2, 0, 1))
        return torch.from_numpy(pixels), label


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
