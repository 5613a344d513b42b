"""Sample grids: the same pixels as torchvision's make_grid/save_image, without importing torchvision, written fast."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest
import torch

from devplug.core.observe.grid import image_grid, write_png


def _torchvision_png(images: torch.Tensor, nrow: int) -> tuple[torch.Tensor, bytes]:
    from torchvision.utils import make_grid, save_image

    grid = make_grid(images, nrow=nrow, normalize=True, value_range=(-1, 1))
    handle = io.BytesIO()
    save_image(grid, handle, format="png")
    return grid, handle.getvalue()


@pytest.mark.parametrize(("shape", "nrow"), [
    ((64, 3, 16, 16), 8),   # the DCGAN example's 8x8 sample grid
    ((5, 3, 8, 12), 3),     # a last row with empty places, non-square images
    ((4, 1, 8, 8), 8),      # grey images become three channels
    ((1, 3, 8, 8), 8),      # one image: itself, unpadded
    ((3, 8, 8), 8),         # one image without a batch dimension
])
def test_grid_and_png_match_torchvision(shape, nrow):
    images = torch.randn(*shape, generator=torch.Generator().manual_seed(0)) * 1.5  # values beyond [-1, 1] too
    expected_grid, expected_png = _torchvision_png(images, nrow)
    grid = image_grid(images, nrow=nrow)
    assert torch.equal(grid, expected_grid)
    handle = io.BytesIO()
    write_png(grid, handle)
    assert torch.equal(_pixels(handle.getvalue()), _pixels(expected_png))


def _pixels(png: bytes) -> torch.Tensor:
    from PIL import Image

    with Image.open(io.BytesIO(png)) as image:
        return torch.tensor(list(image.getdata()))


def _zlib_level(png: bytes) -> int:
    """The compression level a PNG's zlib stream declares (FLEVEL: 0 fastest, 1 fast, 2 default, 3 maximum)."""
    start = png.index(b"IDAT") + 4
    return png[start + 1] >> 6


def test_the_png_is_compressed_at_the_fastest_level_where_torchvision_takes_the_default():
    images = torch.randn(16, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    _, expected_png = _torchvision_png(images, 4)
    handle = io.BytesIO()
    write_png(image_grid(images, nrow=4), handle)
    assert (_zlib_level(handle.getvalue()), _zlib_level(expected_png)) == (0, 2)


def test_grid_leaves_the_images_unchanged():
    images = torch.full((2, 3, 4, 4), 3.0)
    image_grid(images)
    assert torch.equal(images, torch.full((2, 3, 4, 4), 3.0))


def test_grid_refuses_other_shapes():
    with pytest.raises(ValueError, match="N x C x H x W"):
        image_grid(torch.zeros(1, 2, 3, 4, 5))


@pytest.mark.parametrize(("shape", "nrow", "message"), [
    ((0, 3, 8, 8), 8, "no images to lay out: the batch is empty"),
    ((4, 3, 8, 8), 0, "nrow must be at least 1, got 0"),
])
def test_an_empty_batch_or_no_tiles_per_row_is_one_clear_error(shape, nrow, message):
    with pytest.raises(ValueError, match=message):
        image_grid(torch.zeros(shape), nrow=nrow)


def test_log_images_writes_the_png_without_importing_torchvision(tmp_path):
    # torchvision's import loads its datasets, models and operators: seconds at the end of a short run
    script = f"""
import sys, torch, devplug
trainer = devplug.Trainer(devplug.TrainerConfig(device="cpu", log_dir=None, progress=False))
trainer.log_images("samples", torch.zeros(4, 3, 8, 8), path={str(tmp_path / "grid.png")!r})
print("torchvision" in sys.modules)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert done.stdout.strip().splitlines()[-1] == "False"
    assert (tmp_path / "grid.png").read_bytes().startswith(b"\x89PNG")
