"""Every pixel format, file name and folder shape an image folder may hold, through both decoders.

The torch loader (``ImageFolderDataset``, ``--no-cache``) and the DCGAN example's cache
(``dcgan.cache``) decode with the same function, so each case checks both, pixel values included.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
from image_samples import decompression_bomb, latin1_names, write_png, write_tiff
from PIL import Image, JpegImagePlugin

import devplug
from devplug.core.data.images import ImageTooLarge, load_rgb
from devplug.core.data.torch_loader import ImageFolderDataset, list_images
from devplug.core.errors import DataError

from dcgan.cache import decode_image, prepare_cache  # examples/dcgan/

SIZE = 16


def decoded_both_ways(path: Path) -> np.ndarray:
    """``path`` (alone in its folder) as (S, S, 3) uint8 from the torch loader; asserts the cache decodes the same."""
    source = devplug.ImageFolderSource(str(path.parent), image_size=SIZE, mean=(0, 0, 0), std=(1, 1, 1),
                                       skip_unreadable=False)
    tensor, _label = ImageFolderDataset(source)[0]
    pixels = (tensor * 255).round().to(dtype=torch_uint8()).permute(1, 2, 0).numpy()
    np.testing.assert_array_equal(pixels, decode_image(path, SIZE).transpose(1, 2, 0))
    return pixels


def torch_uint8():
    import torch

    return torch.uint8


def one(tmp_path: Path, name: str) -> Path:
    folder = tmp_path / name.split(".")[0]
    folder.mkdir()
    return folder / name


# ---- pixel formats ---------------------------------------------------------------------------------


def test_sixteen_bit_grayscale_png_is_scaled_not_clipped_to_white(tmp_path):
    path = one(tmp_path, "gray16.png")
    values = np.full((30, 40), 128 * 257, np.uint16)  # mid gray in 16 bits
    values[:, 20:] = 64 * 257
    Image.fromarray(values).save(path)
    assert Image.open(path).mode == "I;16"
    pixels = decoded_both_ways(path)
    assert (pixels[:, :4] == 128).all() and (pixels[:, -4:] == 64).all()


def test_sixteen_bit_rgb_png(tmp_path):
    pixels = np.full((20, 24, 3), (65535, 32896, 1028), ">u2")  # big-endian 16-bit samples, as PNG stores them
    path = write_png(one(tmp_path, "rgb16.png"), 24, 20, 16, 2, pixels.tobytes())
    assert (decoded_both_ways(path) == (255, 128, 4)).all()


def stripes(dtype: str, left: float, middle: float, right: float) -> np.ndarray:
    """A 48 x 30 image of three vertical stripes, 16 columns each."""
    values = np.empty((30, 48), dtype)
    values[:, :16], values[:, 16:32], values[:, 32:] = left, middle, right
    return values


def stripe_values(pixels: np.ndarray) -> tuple[int, int, int]:
    """The gray of each stripe after decoding (each must be flat, the same in R, G and B)."""
    shown = []
    for part in (pixels[:, :3], pixels[:, 7:9], pixels[:, -3:]):
        assert len(np.unique(part)) == 1, np.unique(part)
        shown.append(int(part[0, 0, 0]))
    return shown[0], shown[1], shown[2]


@pytest.mark.parametrize(
    ("dtype", "values"),
    [("int16", (-32768, 0, 32767)),  # signed 16-bit: Pillow holds it in mode I; 0 is mid gray
     ("uint32", (0, 2**31, 2**32 - 1)),  # unsigned 32-bit: Pillow holds it in signed 32 bits, the top half negative
     ("int32", (-(2**31), 0, 2**31 - 1)),
     ("uint16", (0, 32768, 65535))],
)
def test_integer_tiffs_are_scaled_from_their_sample_types_full_range(tmp_path, dtype, values):
    path = write_tiff(one(tmp_path, f"{dtype}.tif"), stripes(dtype, *values))
    assert stripe_values(decoded_both_ways(path)) == (0, 128, 255)


def test_a_rotated_signed_tiff_keeps_its_range(tmp_path):
    stored = np.full((48, 30), -32768, np.int16)
    stored[:16] = 32767  # stored: white top, black below; displayed turned clockwise: white on the right
    path = write_tiff(one(tmp_path, "rotated.tif"), stored, orientation=6)
    pixels = decoded_both_ways(path)
    assert (pixels[:, -3:] == 255).all() and (pixels[:, :3] == 0).all()


def test_16_bit_data_in_a_signed_32_bit_tiff_is_scaled_from_16_bits_and_wider_data_from_the_type(tmp_path):
    fits = one(tmp_path, "fits.tif")
    Image.fromarray(stripes("int32", 0, 32768, 65535)).save(fits)  # Pillow writes mode I as signed 32-bit
    over = one(tmp_path, "over.tif")
    Image.fromarray(stripes("int32", -(2**31), 0, 2**31 - 1)).save(over)
    assert Image.open(fits).mode == Image.open(over).mode == "I"
    assert stripe_values(decoded_both_ways(fits)) == stripe_values(decoded_both_ways(over)) == (0, 128, 255)


def test_a_16_bit_pgm_in_mode_i_is_scaled_from_16_bits(tmp_path):
    path = one(tmp_path, "gray16.pgm")
    path.write_bytes(b"P5\n48 30\n65535\n" + stripes(">u2", 0, 32768, 65535).tobytes())
    assert Image.open(path).mode == "I"
    assert stripe_values(decoded_both_ways(path)) == (0, 128, 255)


@pytest.mark.parametrize(
    "values",
    [(0.0, 0.5, 1.0), (0.0, 128.0, 255.0),  # the two conventions: 0..1 and 0..255
     (-1.0, 0.0, 1.0),  # -1..1 (a generator's tanh output): not clipped at 0
     (0.0, 32767.5, 65535.0)],  # beyond 255 (16-bit data in floats): not clipped to white
)
def test_float_tiffs_show_their_whole_range(tmp_path, values):
    path = write_tiff(one(tmp_path, "float.tif"), stripes("float32", *values))
    assert Image.open(path).mode == "F"
    assert stripe_values(decoded_both_ways(path)) == (0, 128, 255)


def _palette(path: Path) -> tuple[int, int, int]:
    Image.new("RGB", (24, 20), (200, 100, 50)).convert("P", palette=Image.Palette.ADAPTIVE).save(path)
    return 200, 100, 50


def _palette_transparent(path: Path) -> tuple[int, int, int]:
    image = Image.new("P", (24, 20), 0)
    image.putpalette([10, 20, 30] * 256)
    image.save(path, transparency=0)  # every pixel transparent: a viewer shows the page behind it
    return 255, 255, 255


def _grayscale(path: Path) -> tuple[int, int, int]:
    Image.new("L", (24, 20), 77).save(path)
    return 77, 77, 77


def _gray_alpha(path: Path) -> tuple[int, int, int]:
    Image.new("LA", (24, 20), (0, 0)).save(path)  # black, fully transparent
    return 255, 255, 255


def _rgba_half(path: Path) -> tuple[int, int, int]:
    Image.new("RGBA", (24, 20), (0, 0, 255, 128)).save(path)  # half-transparent blue over white
    return 127, 127, 255


def _bilevel(path: Path) -> tuple[int, int, int]:
    Image.new("1", (24, 20), 1).save(path)
    return 255, 255, 255


def _cmyk_jpeg(path: Path) -> tuple[int, int, int]:
    Image.new("RGB", (24, 20), (200, 100, 50)).convert("CMYK").save(path, quality=95)
    assert Image.open(path).mode == "CMYK"
    return 200, 100, 50


@pytest.mark.parametrize(
    ("name", "make"),
    [("palette.png", _palette), ("transparent.png", _palette_transparent), ("gray.png", _grayscale),
     ("graya.png", _gray_alpha), ("rgba.png", _rgba_half), ("bilevel.png", _bilevel), ("cmyk.jpg", _cmyk_jpeg)],
)
def test_pixel_formats_come_out_as_8_bit_rgb(tmp_path, name, make):
    path = one(tmp_path, name)
    expected = make(path)
    pixels = decoded_both_ways(path)
    assert pixels.dtype == np.uint8 and pixels.shape == (SIZE, SIZE, 3)
    assert np.abs(pixels.astype(int) - expected).max() <= 4, (pixels[0, 0], expected)


def test_exif_rotated_jpeg_is_shown_upright(tmp_path):
    path = one(tmp_path, "rotated.jpg")
    stored = Image.new("RGB", (40, 20), (255, 0, 0))
    stored.paste((0, 0, 255), (20, 0, 40, 20))  # stored: red left half, blue right half
    exif = Image.Exif()
    exif[0x0112] = 6  # displayed rotated 90 degrees clockwise: red on top, blue at the bottom
    stored.save(path, quality=95, exif=exif)
    pixels = decoded_both_ways(path).astype(int)
    assert pixels[0, 0, 0] > 200 and pixels[0, 0, 2] < 60, pixels[0, 0]  # top: red
    assert pixels[-1, 0, 2] > 200 and pixels[-1, 0, 0] < 60, pixels[-1, 0]  # bottom: blue


def test_reduced_scale_jpeg_decoding_stays_close_to_a_full_decode(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    coarse = rng.uniform(0, 255, size=(8, 10, 3)).astype(np.uint8)
    smooth = np.asarray(Image.fromarray(coarse).resize((480, 360), Image.Resampling.BICUBIC), np.float32)
    photo = np.clip(smooth + rng.normal(0, 10, (360, 480, 1)), 0, 255).astype(np.uint8)
    Image.fromarray(photo).save(tmp_path / "photo.jpg", quality=90)
    scales = []
    draft = JpegImagePlugin.JpegImageFile.draft

    def recording_draft(self, mode, size):
        result = draft(self, mode, size)
        scales.append(self.decoderconfig[0])
        return result

    monkeypatch.setattr(JpegImagePlugin.JpegImageFile, "draft", recording_draft)
    fast = load_rgb(tmp_path / "photo.jpg", 64).astype(np.float64)
    assert scales == [2]  # 360 / 2 = 180 >= 2 x 64: decoded at half scale in the DCT
    full = load_rgb(tmp_path / "photo.jpg", 64, draft=False).astype(np.float64)
    psnr = 10 * np.log10(255**2 / np.mean((fast - full) ** 2))
    assert psnr > 35, psnr


# ---- unreadable files ------------------------------------------------------------------------------


def test_a_decompression_bomb_is_skipped_like_any_unreadable_file(tmp_path, caplog):
    folder = tmp_path / "images"
    folder.mkdir()
    for index in range(3):
        Image.new("RGB", (24, 20), (index * 60, 0, 0)).save(folder / f"img{index}.png")
    decompression_bomb(folder / "img1_bomb.png")
    dataset = ImageFolderDataset(devplug.ImageFolderSource(str(folder), image_size=SIZE))
    with caplog.at_level("WARNING", logger="devplug.core.data.torch_loader"):
        images = [dataset[index][0] for index in range(len(dataset))]
    assert len(images) == 4 and list(dataset.unreadable) == [str(folder / "img1_bomb.png")]
    assert "MAX_IMAGE_PIXELS" in dataset.unreadable[str(folder / "img1_bomb.png")]
    assert any("img1_bomb.png" in record.getMessage() for record in caplog.records)

    strict = ImageFolderDataset(devplug.ImageFolderSource(str(folder), image_size=SIZE, skip_unreadable=False))
    with pytest.raises(DataError, match=r"img1_bomb\.png.*MAX_IMAGE_PIXELS = 89,478,485.*raise the limit"):
        strict[[path.name for path, _ in strict.items].index("img1_bomb.png")]

    _dataset, report = prepare_cache(folder, SIZE, tmp_path / "cache", workers=0)
    assert report.images == 3 and report.skipped[0][0] == "img1_bomb.png"
    assert "ImageTooLarge" in report.skipped[0][1] and "MAX_IMAGE_PIXELS" in report.skipped[0][1]


def test_load_rgb_names_the_limit_of_a_decompression_bomb(tmp_path):
    with pytest.raises(ImageTooLarge, match=r"400000000 pixels.*PIL\.Image\.MAX_IMAGE_PIXELS = None removes it"):
        load_rgb(decompression_bomb(tmp_path / "bomb.png"), SIZE)


# ---- file names and folder walks -------------------------------------------------------------------


def test_file_names_that_are_not_utf8_decode_and_show_readably(tmp_path, caplog):
    good, bad = latin1_names(tmp_path / "images")
    assert [path for path, _ in list_images(tmp_path / "images")] == [good, bad]
    dataset = ImageFolderDataset(devplug.ImageFolderSource(str(tmp_path / "images"), image_size=SIZE))
    with caplog.at_level("WARNING", logger="devplug.core.data.torch_loader"):
        dataset[1]  # the garbage file: replaced by the next readable one, and named in the warning
    assert any("d\\xe9j\\xe0.jpg" in record.getMessage() for record in caplog.records)

    dataset, report = prepare_cache(tmp_path / "images", SIZE, tmp_path / "cache", workers=0)
    assert report.built and report.images == 1
    line = report.describe()
    assert "skipped 1 unreadable (first: d\\xe9j\\xe0.jpg:" in line
    line.encode("utf-8")  # printable as it is
    assert (np.asarray(dataset[0][0]).transpose(1, 2, 0) == load_rgb(good, SIZE)).all()
    _again, reused = prepare_cache(tmp_path / "images", SIZE, tmp_path / "cache", workers=0)
    assert not reused.built


def classes(root: Path) -> Path:
    for name, count in (("cats", 2), ("dogs", 1)):
        (root / name).mkdir(parents=True)
        for index in range(count):
            Image.new("RGB", (24, 20), (index * 90, 0, 0)).save(root / name / f"{index}.png")
    return root


def test_a_link_to_the_root_inside_it_adds_no_image_twice(tmp_path):
    root = classes(tmp_path / "data")
    (root / "all").symlink_to(root)
    (root / "kittens").symlink_to(root / "cats")  # a second name for one class folder
    items = list_images(root)
    assert [(p.relative_to(root).as_posix(), label) for p, label in items] == [
        ("cats/0.png", 0), ("cats/1.png", 0), ("dogs/0.png", 1)]


def test_a_symlink_loop_is_walked_once(tmp_path):
    root = classes(tmp_path / "data")
    (root / "cats" / "again").symlink_to(root / "cats")
    (root / "cats" / "up").symlink_to(root)
    (root / "dogs" / "deeper").mkdir()
    (root / "dogs" / "deeper" / "back").symlink_to(root / "dogs")
    assert len(list_images(root)) == 3


def test_a_symlinked_root_is_the_same_data_set_and_the_same_cache(tmp_path):
    root = classes(tmp_path / "data")
    (tmp_path / "link").symlink_to(root)
    assert [p.name for p, _ in list_images(tmp_path / "link")] == [p.name for p, _ in list_images(root)]
    _dataset, built = prepare_cache(root, SIZE, tmp_path / "cache", workers=0)
    _dataset, reused = prepare_cache(tmp_path / "link", SIZE, tmp_path / "cache", workers=0)
    assert built.built and not reused.built and reused.path == built.path


def test_an_empty_path_is_not_the_current_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(classes(tmp_path / "data"))
    with pytest.raises(DataError, match="empty"):
        list_images("")


def test_folder_walk_keeps_the_sorted_order_and_labels(tmp_path, caplog):
    root = tmp_path / "data"
    for relative in ("b/z.png", "b/a/y.png", "b/a/x.jpg", "a/c.png", "top.png"):
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (8, 8)).save(root / relative)
    (root / ".hidden").mkdir()
    Image.new("RGB", (8, 8)).save(root / ".hidden" / "h.png")
    with caplog.at_level(logging.WARNING):
        items = [(p.relative_to(root).as_posix(), label) for p, label in list_images(root)]
    assert items == [("top.png", 0), ("a/c.png", 1), ("b/z.png", 2), ("b/a/x.jpg", 2), ("b/a/y.png", 2)]
    assert not caplog.records
