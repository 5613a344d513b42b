"""Pieces the DCGAN benchmarks share: the example's training step, loader streams, a demo image folder.

The training step (``DCGANStep``), models, data sets, image cache and ``to_unit_range`` are imported from
the example's package (``examples/dcgan/``) unchanged, so the benchmarks time exactly what
``examples/dcgan.py`` runs. The demo folder (``make_demo_folder``) lives in ``_photos.py``, which imports no
devplug, and is re-exported here.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
if str(EXAMPLES) not in sys.path:  # the example's package, dcgan, is the folder examples/dcgan/
    sys.path.insert(0, str(EXAMPLES))

from _photos import make_demo_folder  # noqa: E402

import devplug  # noqa: E402

from dcgan.cache import prepare_cache  # noqa: E402
from dcgan.embedded_data import FakeImages, ShapesDataset  # noqa: E402
from dcgan.models import PRESETS, ModelSpec  # noqa: E402
from dcgan.step import DCGANStep, to_unit_range  # noqa: E402

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
    therefore needs the epoch advanced at every epoch end, which `BatchStream` does through this.
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
