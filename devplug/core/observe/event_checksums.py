"""TensorBoard's record checksums computed in C (google-crc32c) rather than in tensorboard's pure Python.

Every record tensorboard writes to an event file carries two masked CRC-32C checksums. Without TensorFlow,
tensorboard computes them a byte at a time in Python: about 85 ms for one 700 KB sample grid, on its
writer thread and holding the GIL, so the training thread stalls for as long (and ``close()`` waits for it
at the end of a run). With ``google-crc32c`` installed (the ``tensorboard`` extra installs it), devplug has
tensorboard's record writer use that library's C implementation instead: the same checksums, about 2,000
times faster (0.04 ms for that grid on a Zen 4 core). The event files are byte for byte the same.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("devplug")

#: CRC-32C of this input is 0xE3069283, the check value of the CRC-32C standard (RFC 3720, appendix B.4).
_CHECK_INPUT = b"123456789"
_CHECK_VALUE = 0xE3069283


def _masked(crc: int) -> int:
    """A CRC-32C masked as TensorFlow's record format masks it (rotated right by 15 bits, plus a constant)."""
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def use_native_record_checksums() -> bool:
    """Make tensorboard's record writer checksum records with google-crc32c's C code; True when it does.

    Leaves tensorboard as it is (False) where google-crc32c is missing or only its pure-Python fallback is
    installed, where tensorboard's writer has no such function to replace, or where the two disagree on a
    known input.
    """
    try:
        import google_crc32c
        from tensorboard.summary.writer import record_writer
    except ImportError:
        return False
    current: Any = getattr(record_writer, "masked_crc32c", None)
    if current is None:
        return False
    if getattr(current, "devplug_native", False):
        return True
    if getattr(google_crc32c, "implementation", "c") != "c" or google_crc32c.value(_CHECK_INPUT) != _CHECK_VALUE:
        return False

    def masked_crc32c(data: bytes) -> int:
        """The masked CRC-32C of ``data`` (what tensorboard's own function returns, computed in C)."""
        return _masked(google_crc32c.value(bytes(data)))

    if masked_crc32c(_CHECK_INPUT) != current(_CHECK_INPUT):
        log.debug("tensorboard's record checksum differs from google-crc32c's: left as it is")
        return False
    masked_crc32c.devplug_native = True  # type: ignore[attr-defined]
    record_writer.masked_crc32c = masked_crc32c
    return True
