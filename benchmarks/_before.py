"""The image-folder decoder ``ImageFolderDataset`` used before reduced-scale decoding, kept to measure against.

Full-resolution decode, then torchvision ``Resize`` + ``CenterCrop`` + ``ToTensor`` + ``Normalize``: what
``examples/dcgan.py --no-cache`` decoded with on the torch loader until reduced-scale decoding.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch.utils.data import Dataset

from devplug.toolkit import list_images


def before_decoder(image_size: int) -> Callable[[str | Path], torch.Tensor]:
    """One file to a normalised ``(3, S, S)`` float tensor, the way before reduced-scale decoding."""
    from PIL import Image
    from torchvision import transforms

    transform = transforms.Compose([transforms.Resize(image_size), transforms.CenterCrop(image_size),
                                    transforms.ToTensor(), transforms.Normalize((0.5,) * 3, (0.5,) * 3)])

    def decode(path: str | Path) -> torch.Tensor:
        with Image.open(path) as image:
            return transform(image.convert("RGB"))

    return decode


class BeforeImageFolder(Dataset):
    """``(image, label)`` for every image under ``root``, decoded by `before_decoder`."""

    def __init__(self, root: str | Path, image_size: int) -> None:
        self.items = list_images(root)
        self.decode = before_decoder(image_size)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path, label = self.items[index]
        return self.decode(path), label
