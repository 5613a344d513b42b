"""How the example writes sizes: byte counts as ``df -H`` does."""

from __future__ import annotations


def human_bytes(nbytes: float) -> str:
    """``1.2 GB``-style size (powers of 1000, as ``df -H`` prints)."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if nbytes < 1000 or unit == "TB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1000
    raise AssertionError("unreachable")
