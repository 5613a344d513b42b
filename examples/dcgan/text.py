"""How the example writes sizes and error messages: byte counts as ``df -H`` does, errors on one line."""

from __future__ import annotations

from devplug.toolkit import printable


def human_bytes(nbytes: float) -> str:
    """``1.2 GB``-style size (powers of 1000, as ``df -H`` prints)."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if nbytes < 1000 or unit == "TB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1000
    raise AssertionError("unreachable")


def one_line(error: BaseException) -> str:
    """An error message on one line (some wrapped library messages span several), at most 600 characters."""
    text = printable(" ".join(str(error).split()))  # a file name that is not UTF-8 prints as \xNN
    return text if len(text) <= 600 else text[:597] + "..."
