"""Image files made byte by byte for the loaders' tests: odd PNGs, a decompression bomb, latin-1 names."""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image


def write_png(path: Path, width: int, height: int, bit_depth: int, color_type: int, pixels: bytes = b"") -> Path:
    """A PNG written byte by byte (Pillow cannot write 16-bit RGB): rows of ``pixels``, or a header only."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    row = len(pixels) // height if pixels else 0
    raw = b"".join(b"\0" + pixels[y * row:(y + 1) * row] for y in range(height)) if pixels else b"\0" * 64
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, bit_depth,
                                                                        color_type, 0, 0, 0))
                     + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))
    return path


def write_tiff(path: Path, pixels: np.ndarray, orientation: int = 1) -> Path:
    """A one-strip grayscale TIFF written byte by byte, its samples of ``pixels``' type (Pillow writes 16-bit
    signed and 32-bit unsigned images as signed 32-bit): bits per sample and signedness from the dtype, and
    ``orientation`` (the TIFF tag EXIF shares: 6 shows the stored image turned 90 degrees clockwise)."""
    height, width = pixels.shape
    data = pixels.astype(pixels.dtype.newbyteorder("<")).tobytes()
    sample_format = {"u": 1, "i": 2, "f": 3}[pixels.dtype.kind]
    short, long = 3, 4
    entries = [(256, long, width), (257, long, height), (258, short, pixels.dtype.itemsize * 8), (259, short, 1),
               (262, short, 1), (273, long, 0), (274, short, orientation), (277, short, 1), (278, long, height),
               (279, long, len(data)), (339, short, sample_format)]
    offset = 8 + 2 + 12 * len(entries) + 4  # the pixels follow the header and the one directory
    directory = b"".join(struct.pack("<HHII", tag, kind, 1, offset if tag == 273 else value)
                         for tag, kind, value in entries)  # a one-value SHORT sits in the low bytes, little-endian
    path.write_bytes(b"II*\0" + struct.pack("<I", 8) + struct.pack("<H", len(entries)) + directory
                     + struct.pack("<I", 0) + data)
    return path


def decompression_bomb(path: Path) -> Path:
    """A 20000 x 20000 PNG header (400 M pixels, over twice Pillow's limit) in a few hundred bytes."""
    return write_png(path, 20000, 20000, 1, 0)


def latin1_names(folder: Path) -> tuple[Path, Path]:
    """``café.jpg`` (readable) and ``déjà.jpg`` (garbage), both named in latin-1 bytes, not UTF-8."""
    folder.mkdir()
    good, bad = folder / os.fsdecode(b"caf\xe9.jpg"), folder / os.fsdecode(b"d\xe9j\xe0.jpg")
    try:
        Image.new("RGB", (24, 20), (10, 200, 30)).save(good)
    except (OSError, UnicodeError):
        pytest.skip("this file system accepts only UTF-8 file names")
    bad.write_bytes(b"not an image")
    return good, bad
