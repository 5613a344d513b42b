"""One image file to an 8-bit RGB square: every pixel format, EXIF orientation, reduced-scale JPEG decoding.

`load_rgb` is what both the torch image-folder loader and the DCGAN example's cache decode with, so
the two agree pixel for pixel. The geometry is torchvision's ``Resize(size)`` + ``CenterCrop(size)``
(short side to ``size``, long side truncated, crop offsets rounded), done in one antialiased
``Image.resize`` over the crop's box in the source.

Speed: a JPEG much larger than the target is decoded at 1/2, 1/4 or 1/8 scale inside the DCT
(Pillow's ``draft``), never below ``DRAFT_MARGIN`` × the target size, so the resize that follows still
antialiases from at least that many source pixels per output pixel (``benchmarks/decode.py`` measures the
speed and the PSNR against a full decode).

Pixel formats: integer images are scaled to 8 bits from the full range of their samples' type, never
clipped or wrapped: 16-bit (``I;16*``) from 0..65535, and Pillow's 32-bit mode ``I`` from the type the
file declares (a TIFF's bits per sample and signedness: signed 16-bit from -32768..32767, unsigned 32-bit
from 0..2**32-1, signed 32-bit from -2**31..2**31-1, except that values which all fit 0..65535 are 16-bit data
in the 32-bit file Pillow writes of mode ``I``: from 0..65535); without a declaration (a 16-bit PGM, or a 16-bit
PNG in older Pillow) from 0..65535 where the values fit, else the signed 32-bit range. Float images are
scaled from 0..1 or 0..255 where their values lie within either, else from their own least to greatest
finite value. Palette, grayscale, bilevel, CMYK and YCbCr are converted, and alpha composited
over white (what an image viewer shows on a white page). An image over Pillow's decompression-bomb limit
raises `ImageTooLarge`, which says what the limit is and how to raise it.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # numpy is imported when an image is decoded: it is not a dependency of devplug itself
    import numpy as np

#: A JPEG is decoded at reduced scale only down to this multiple of the target size (short side).
DRAFT_MARGIN = 2
#: EXIF tag of the orientation; values 5-8 swap width and height.
EXIF_ORIENTATION = 0x0112
_ALPHA_MODES = ("RGBA", "LA", "PA", "RGBa", "La")
_SIXTEEN_BIT = ("I;16", "I;16L", "I;16B", "I;16N")
#: The range of a signed 32-bit sample (a TIFF that declares it, or Pillow's mode ``I``).
_INT32_RANGE = (-(2**31), 2**31 - 1)
#: TIFF tags: bits per sample, and the sample format (1 unsigned integer, 2 signed integer, 3 float).
_BITS_PER_SAMPLE, _SAMPLE_FORMAT = 258, 339


class ImageTooLarge(ValueError):
    """An image over Pillow's decompression-bomb limit (``PIL.Image.MAX_IMAGE_PIXELS``)."""


def display_path(path: str | bytes | os.PathLike[Any]) -> str:
    """A path as printable text: bytes of a file name that are not valid UTF-8 appear as ``\\xNN``.

    ``os.listdir`` gives such names (a latin-1 ``café.jpg`` from an old archive) as strings with lone
    surrogates, which Python refuses to print or encode; this text always can be.
    """
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def printable(text: str) -> str:
    """``text`` with any lone surrogate (an undecodable file-name byte) shown as ``\\xNN``."""
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:  # a surrogate that is not an escaped byte
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def to_rgb(image: Any, sample_range: tuple[int, int] | None = None) -> Any:
    """An 8-bit ``RGB`` Pillow image for ``image`` in any mode (see the module docstring for the rules).

    ``sample_range``: the least and greatest value of the integer type the file stores its samples in
    (`declared_range`); by default read from ``image`` itself, which a transposed copy no longer tells.
    """
    from PIL import Image

    mode = image.mode
    if mode == "RGB":
        return image
    if mode in _SIXTEEN_BIT or mode in ("I", "F"):
        import numpy as np

        declared = sample_range if sample_range is not None else declared_range(image)
        return Image.fromarray(_to_uint8(np.asarray(image), mode, declared), "L").convert("RGB")
    if mode == "P" and "transparency" in image.info:
        image, mode = image.convert("RGBA"), "RGBA"
    if mode in _ALPHA_MODES:
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return image.convert("RGB")


def declared_range(image: Any) -> tuple[int, int] | None:
    """The range of the integer type a TIFF declares for its samples (bits per sample, signed or not).

    ``None`` for float samples and for any other format: Pillow's mode then says all there is to know
    (``I;16`` is unsigned 16-bit; ``I`` holds signed 32-bit values, or 16-bit ones from a PGM or PNG).
    """
    tags = getattr(image, "tag_v2", None)
    if tags is None:
        return None
    bits, kind = _first(tags.get(_BITS_PER_SAMPLE, 1)), _first(tags.get(_SAMPLE_FORMAT, 1))
    if not isinstance(bits, int) or not 1 <= bits <= 32:
        return None
    if kind == 1:  # unsigned integer
        return 0, 2**bits - 1
    if kind == 2:  # two's complement signed integer
        return -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    return None  # IEEE float or undefined


def _first(value: Any) -> Any:
    """A TIFF tag's first value (Pillow gives per-sample tags as tuples)."""
    return value[0] if isinstance(value, tuple) and value else value


def _to_uint8(pixels: np.ndarray, mode: str, declared: tuple[int, int] | None = None) -> np.ndarray:
    """Scale a single-channel 16-bit, 32-bit integer or float array to 0..255 uint8 (see the module docstring)."""
    import numpy as np

    if mode == "F":
        values = pixels.astype(np.float64)
        finite = values[np.isfinite(values)]
        low, high = _float_range(finite) if finite.size else (0.0, 1.0)
        values = np.nan_to_num(values, nan=low, posinf=high, neginf=low)
    else:
        if declared is not None and declared[1] > _INT32_RANGE[1] and pixels.dtype == np.int32:
            pixels = pixels.view(np.uint32)  # unsigned 32-bit samples, which Pillow keeps in signed ones
        values = pixels.astype(np.float64)

        def fits_16_bits() -> bool:  # read only where the scale depends on it: two passes over the pixels
            return not values.size or bool(values.min() >= 0 and values.max() <= 65535)

        if declared is not None and not (declared == _INT32_RANGE and fits_16_bits()):
            low, high = declared
        elif mode == "I" and not fits_16_bits():
            low, high = _INT32_RANGE  # the full signed 32-bit range
        else:
            low, high = 0, 65535  # 16-bit range: 65535 -> 255, 32768 -> 127.5
    values = (values - low) / ((high - low) or 1) * 255.0
    return np.clip(np.rint(values), 0, 255).astype(np.uint8)


def _float_range(finite: np.ndarray) -> tuple[float, float]:
    """The values a float image's 0 and 255 stand for: 0..1 or 0..255 where it lies within, else its own range."""
    low, high = float(finite.min()), float(finite.max())
    if low >= 0 and high <= 1:
        return 0.0, 1.0
    if low >= 0 and high <= 255:
        return 0.0, 255.0
    return low, high


def crop_box(width: int, height: int, size: int) -> tuple[float, float, float, float]:
    """The source box that torchvision's ``Resize(size)`` + ``CenterCrop(size)`` keep of a width × height image."""
    if width <= height:
        new_w, new_h = size, int(size * height / width)
    else:
        new_w, new_h = int(size * width / height), size
    left, top = round((new_w - size) / 2.0), round((new_h - size) / 2.0)
    sx, sy = width / new_w, height / new_h
    return left * sx, top * sy, (left + size) * sx, (top + size) * sy


def load_rgb(path: str | os.PathLike[str], size: int, *, draft: bool = True, margin: int = DRAFT_MARGIN) -> np.ndarray:
    """The image at ``path`` as ``(size, size, 3)`` uint8 RGB: EXIF-rotated, short side resized, center-cropped.

    ``draft=False`` decodes JPEGs at full resolution (the reference the benchmark compares with);
    ``margin`` is the least short side, in multiples of ``size``, a reduced-scale decode keeps. Raises
    `ImageTooLarge` over the decompression-bomb limit and Pillow's own errors for unreadable files.
    """
    import numpy as np
    from PIL import Image, ImageOps

    try:
        image: Image.Image = Image.open(path)
    except Image.DecompressionBombError as exc:
        raise ImageTooLarge(too_large_message(exc)) from None
    with image:
        width, height = image.size
        orientation = _orientation(image)
        if orientation in (5, 6, 7, 8):
            width, height = height, width
        if draft and image.format in ("JPEG", "MPO"):
            # The largest DCT scale (8, 4, 2) that keeps the short side >= margin x size.
            factor = min(width, height) // (size * margin)
            scale = next((s for s in (8, 4, 2) if s <= factor), 1)
            if scale > 1:
                image.draft(image.mode, (image.size[0] // scale, image.size[1] // scale))
        declared = declared_range(image)  # before a transpose, whose copy no longer tells it
        if orientation != 1:
            image = ImageOps.exif_transpose(image)
        rgb = to_rgb(image, declared)
        scale_x, scale_y = rgb.size[0] / width, rgb.size[1] / height  # < 1 after a reduced-scale decode
        left, top, right, bottom = crop_box(width, height, size)
        box = (left * scale_x, top * scale_y, right * scale_x, bottom * scale_y)
        resized = rgb.resize((size, size), Image.Resampling.BILINEAR, box=box)
    return np.array(resized, dtype=np.uint8)  # a writable copy


def _orientation(image: Any) -> int:
    """The EXIF orientation (1-8; 1 = stored upright); 1 when the EXIF data is missing or broken."""
    try:
        value = image.getexif().get(EXIF_ORIENTATION, 1)
    except Exception:  # a broken EXIF block does not make the pixels unreadable
        return 1
    return value if isinstance(value, int) and 1 <= value <= 8 else 1


def too_large_message(error: BaseException) -> str:
    """Pillow's decompression-bomb error, plus the limit and how to raise it."""
    from PIL import Image

    limit = Image.MAX_IMAGE_PIXELS
    return (f"{error} Larger than Pillow's decompression-bomb limit (PIL.Image.MAX_IMAGE_PIXELS = {limit:,} pixels; "
            "images up to twice that decode with a warning); if the file is trusted, raise the limit "
            "(PIL.Image.MAX_IMAGE_PIXELS = None removes it) or shrink the image")
