"""Image grids for the loggers: a batch of images tiled into one picture, and that picture written as a PNG.

The same pixels as torchvision's ``make_grid(..., normalize=True, value_range=...)`` and ``save_image``
(``tests/core/observe/test_grid.py`` compares them), in a few tensor operations and Pillow: importing
torchvision for these two functions loads its datasets, models and operators, which costs more than the grid
itself at the end of a short run. The PNG is compressed at zlib's fastest level, where ``save_image`` takes
Pillow's default (6): a trained model's samples are written several times faster, as a file about 17 %
larger (``benchmarks/image_logging.py``).
"""

from __future__ import annotations

import math
from typing import IO

import torch
import torch.nn.functional as F

#: Pixels between the tiles and around the grid (torchvision's default).
PADDING = 2
#: zlib level of the PNGs written (1: fastest; sample grids are written during training).
PNG_COMPRESS_LEVEL = 1


def image_grid(images: torch.Tensor, *, nrow: int = 8, value_range: tuple[float, float] = (-1.0, 1.0),
               padding: int = PADDING) -> torch.Tensor:
    """``images`` (N×C×H×W, or one C×H×W or H×W image) as one C×H'×W' float grid in [0, 1].

    Values are clamped to ``value_range`` and scaled from it to [0, 1]; ``nrow`` tiles per row, ``padding``
    black pixels between and around the tiles; one-channel images become three (grey). A batch of one
    image is that image, unpadded.
    """
    tensor = images.detach()
    if tensor.dim() == 2:
        tensor = tensor.unsqueeze(0)
    if tensor.dim() == 3:
        tensor = tensor.unsqueeze(0)
    if tensor.dim() != 4:
        raise ValueError(f"images must be N x C x H x W, got shape {tuple(images.shape)}")
    if tensor.size(0) == 0:
        raise ValueError("no images to lay out: the batch is empty")
    if nrow < 1:
        raise ValueError(f"nrow must be at least 1, got {nrow}")
    if tensor.size(1) == 1:
        tensor = tensor.expand(-1, 3, -1, -1)
    low, high = value_range
    tensor = tensor.clamp(min=low, max=high).sub_(low).div_(max(high - low, 1e-5))
    count = tensor.size(0)
    if count == 1:
        return tensor.squeeze(0)
    across = min(nrow, count)
    down = math.ceil(count / across)
    channels, height, width = tensor.shape[1:]
    tiles = F.pad(tensor, (padding, 0, padding, 0))  # each tile with the padding above and to its left
    if down * across > count:  # the last row's empty places stay black
        tiles = torch.cat([tiles, tiles.new_zeros(down * across - count, *tiles.shape[1:])])
    grid = (tiles.reshape(down, across, channels, height + padding, width + padding)
            .permute(2, 0, 3, 1, 4).reshape(channels, down * (height + padding), across * (width + padding)))
    return F.pad(grid, (0, padding, 0, padding))  # and the padding below and to the right of the last tiles


def write_png(grid: torch.Tensor, handle: IO[bytes]) -> None:
    """Write ``grid`` (C×H×W in [0, 1], C = 3) to ``handle`` as an 8-bit RGB PNG (values rounded to the nearest),
    compressed at zlib's fastest level."""
    from PIL import Image

    pixels = grid.mul(255).add_(0.5).clamp_(0, 255).permute(1, 2, 0).to("cpu", torch.uint8).numpy()
    Image.fromarray(pixels).save(handle, format="png", compress_level=PNG_COMPRESS_LEVEL)
