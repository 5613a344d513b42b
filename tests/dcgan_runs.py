"""Running the DCGAN example in-process at its tiny test size, and image folders to run it on."""

from __future__ import annotations

from pathlib import Path

import torch
from PIL import Image

from dcgan import train as example  # examples/dcgan/, on pytest's pythonpath

TINY = ["--device", "cpu", "--precision", "32-true", "--no-progress", "--workers", "0",
        "--nz", "8", "--ngf", "4", "--ndf", "4", "--image-size", "16", "--batch-size", "4"]


def write_images(folder: Path, count: int = 10, *, classes: bool = True) -> list[Path]:
    """JPEG and PNG files of assorted sizes and modes (RGB, RGBA, grayscale), in class folders or flat."""
    paths = []
    generator = torch.Generator().manual_seed(3)
    for index in range(count):
        sub = folder / (f"class_{index % 2}" if classes else "")
        sub.mkdir(parents=True, exist_ok=True)
        width, height = 24 + 8 * (index % 3), 20 + 6 * (index % 4)
        pixels = torch.randint(0, 256, (height, width, 3), dtype=torch.uint8, generator=generator).numpy()
        image = Image.fromarray(pixels)
        if index % 2 == 0:
            path = sub / f"img{index}.jpg"
            image.save(path, quality=90)
        else:
            path = sub / f"img{index}.png"
            (image.convert("RGBA") if index % 4 == 1 else image.convert("L")).save(path)
        paths.append(path)
    return paths


def run(argv: list[str]) -> int:
    return example.main([*TINY, *argv])
