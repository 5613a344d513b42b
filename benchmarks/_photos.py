"""A folder of photo-like JPEGs for the image-folder benchmarks (numpy and Pillow only: no devplug, no torch).

Kept apart from ``_dcgan.py`` so that ``reference_dcgan.py``, the plain-PyTorch reference, can write its demo
folder without importing devplug.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np


def make_demo_folder(root: Path, count: int, width: int = 480, height: int = 360, seed: int = 0) -> float:
    """Write ``count`` photo-like JPEGs of ``width``×``height`` into ``root``; seconds taken.

    The default 480×360 is the size of the photos in a typical DCGAN image folder.

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
