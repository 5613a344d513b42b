"""One image file to an 8-bit RGB square: every pixel format, EXIF orientation, reduced-scale JPEG decoding.

`load_rgb` is what both the torch image-folder loader and the DCGAN example's cache decode with, so
the two agree pixel for pixel. The geometry is torchvision's ``Resize(size)`` + ``CenterCrop(size)``
(short side to ``size``, long side truncated, crop offsets rounded), done in one antialiased
``Image.resize`` over the crop's box in the source.

Speed: a JPEG much larger than the target is decoded at 1/2, 1/4 or 1/8 scale inside the DCT
(Pillow's ``draft``), never below ``DRAFT_MARGIN`` × the target size, so the resize that follows still
antialiases from at least that many source pixels per output pixel (``benchmarks/decode.py`` measures the
speed and the PSNR against a full decode).

Pixel formats: 16-bit (``I;16*``) and 32-bit integer images are scaled to 8 bits (not clipped), float
images from 0..1 or 0..255, palette, grayscale, bilevel, CMYK and YCbCr converted, and alpha composited
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


def to_rgb(image: Any) -> Any:
    """An 8-bit ``RGB`` Pillow image for ``image`` in any mode (see the module docstring for the rules)."""
    from PIL import Image

    mode = image.mode
    if mode == "RGB":
        return image
    if mode in _SIXTEEN_BIT or mode in ("I", "F"):
        import numpy as np

        return Image.fromarray(_to_uint8(np.asarray(image), mode), "L").convert("RGB")
    if mode == "P" and "transparency" in image.info:
        image, mode = image.convert("RGBA"), "RGBA"
    if mode in _ALPHA_MODES:
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return image.convert("RGB")


def _to_uint8(pixels: np.ndarray, mode: str) -> np.ndarray:
    """Scale a single-channel 16-bit, 32-bit integer or float array to 0..255 uint8."""
    import numpy as np

    values = pixels.astype(np.float64)
    if mode == "F":
        finite = values[np.isfinite(values)]
        scale = 255.0 if finite.size and finite.max() <= 1.0 else 1.0  # 0..1 floats, else already 0..255
        values = np.nan_to_num(values, nan=0.0, posinf=255.0 / scale, neginf=0.0) * scale
    elif mode == "I" and values.size and (values.max() > 65535 or values.min() < 0):
        values = (values - np.iinfo(np.int32).min) / (2**32 - 1) * 255.0  # the full 32-bit range
    else:
        values = values / 257.0  # 16-bit range: 65535 -> 255, 32768 -> 127.5
    return np.clip(np.rint(values), 0, 255).astype(np.uint8)


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
        if orientation != 1:
            image = ImageOps.exif_transpose(image)
        rgb = to_rgb(image)
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
