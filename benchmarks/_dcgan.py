"""Pieces the DCGAN benchmarks share: the example's training step, loader streams, a demo image folder.

The training step (``DCGANStep``), models, data sets, image cache and ``to_unit_range`` are imported from
``examples/`` unchanged, so the benchmarks time exactly what ``examples/dcgan.py`` runs.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
if str(EXAMPLES) not in sys.path:
    sys.path.insert(0, str(EXAMPLES))

from dcgan import DCGANStep, to_unit_range  # noqa: E402
from dcgan_lib.data import prepare_cache  # noqa: E402
from dcgan_lib.default_data import FakeImages, ShapesDataset  # noqa: E402
from dcgan_lib.models import PRESETS, ModelSpec  # noqa: E402

import devplug  # noqa: E402

__all__ = [
    "PRESETS",
    "BatchStream",
    "DCGANStep",
    "EpochDriver",
    "FakeImages",
    "ModelSpec",
    "ShapesDataset",
    "make_demo_folder",
    "prepare_cache",
    "to_unit_range",
]


class EpochDriver:
    """Advances ``trainer.epochs()`` by hand, so the Trainer's loaders can be read in blocks of batches.

    A Trainer loader counts the batches of the current epoch and, when iterated again, skips that many
    (to resume mid-epoch); only ``trainer.epochs()`` resets the count. Reading loaders outside that loop
    therefore needs the epoch advanced at every epoch end, which :class:`BatchStream` does through this.
    """

    def __init__(self, trainer: devplug.Trainer) -> None:
        self.trainer = trainer
        self._epochs = trainer.epochs(sys.maxsize)
        next(self._epochs)

    def advance(self) -> None:
        """End the current epoch (reset the Trainer's per-epoch batch count) and start the next."""
        next(self._epochs)

    def stream(self, loader: Any) -> BatchStream:
        """An endless stream of ``loader``'s batches, epoch after epoch."""
        return BatchStream(loader, self)


class BatchStream:
    """Batches of a Trainer loader (already on the device), epoch after epoch, with the epoch end on demand."""

    def __init__(self, loader: Any, driver: EpochDriver) -> None:
        self.loader = loader
        self.driver = driver
        self._batches: Iterator[Any] | None = None

    def next(self) -> Any:
        """The next batch, starting a new epoch when the current one is exhausted."""
        for _ in range(2):
            if self._batches is None:
                self._batches = iter(self.loader)
            batch = next(self._batches, None)
            if batch is not None:
                return batch
            self._batches = None
            self.driver.advance()
        raise RuntimeError("the loader yielded no batch in a fresh epoch (fewer samples than one batch?)")

    def finish_epoch(self) -> None:
        """Read the current epoch to its end (untimed), so the loader's workers go idle."""
        if self._batches is not None:
            for _ in self._batches:
                pass
            self._batches = None
            self.driver.advance()


def make_demo_folder(root: Path, count: int, width: int = 480, height: int = 360, seed: int = 0) -> float:
    """Write ``count`` photo-like JPEGs of ``width``×``height`` (seed 000's 480×360) into ``root``; seconds taken.

    Each is a smooth random color field with film-like grain, so the files have the size and decode cost of
    ordinary photos (~70 KB at quality 90), not of flat synthetic images.
    """
    from PIL import Image

    start = time.perf_counter()
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for index in range(count):
        coarse = rng.uniform(0, 255, size=(height // 60 + 2, width // 60 + 2, 3)).astype(np.uint8)
        smooth = np.asarray(Image.fromarray(coarse).resize((width, height), Image.Resampling.BICUBIC), np.float32)
        grain = rng.normal(0.0, 10.0, size=(height, width, 1)).astype(np.float32)
        pixels = np.clip(smooth + grain, 0, 255).astype(np.uint8)
        Image.fromarray(pixels).save(root / f"photo_{index:05d}.jpg", quality=90)
    return time.perf_counter() - start
