"""What a file that should be a checkpoint looks like, from its first and last bytes, in a few words.

Used to say why a file cannot be read (empty, truncated, a text or HTML page, a git-LFS pointer, random
bytes) before torch is asked, so the reason is one plain line and never torch's advice to load untrusted
files with ``weights_only=False``.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

_HEAD = 1024
LFS_PREFIX = b"version https://git-lfs"
ZIP_MAGIC = b"PK\x03\x04"


def _text(head: bytes) -> str | None:
    """``head`` decoded when it looks like text (UTF-8, no NUL, mostly printable), else None."""
    if b"\x00" in head:
        return None
    text = head.decode("utf-8", errors="ignore")
    if len(text.encode()) < 0.95 * len(head):
        return None
    printable = sum(ch.isprintable() or ch in "\r\n\t" for ch in text)
    return text if printable >= 0.95 * max(len(text), 1) else None


def _shown(text: str) -> str:
    start = " ".join(text.split())[:40]
    return repr(start + ("…" if len(" ".join(text.split())) > 40 else ""))


def unreadable_reason(path: Path) -> str:
    """Why ``path`` cannot be a checkpoint torch wrote, judged from its bytes; ``""`` when it may be one."""
    size = path.stat().st_size
    if size == 0:
        return "is empty (0 bytes): the save that wrote it did not finish, or the copy failed"
    with path.open("rb") as handle:
        head = handle.read(_HEAD)
    if ZIP_MAGIC.startswith(head) and size < len(ZIP_MAGIC):
        return f"is truncated ({size} bytes, its end is missing): the save or the copy did not finish"
    if head.startswith(LFS_PREFIX):
        return "is a git-LFS pointer, not the checkpoint itself: fetch the file with `git lfs pull`"
    if head.startswith(ZIP_MAGIC):
        if not zipfile.is_zipfile(path):
            return f"is truncated ({size} bytes, its end is missing): the save or the copy did not finish"
        return ""
    if head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
        return ""  # a pickle (torch's legacy format): torch decides
    text = _text(head)
    if text is not None:
        lowered = text.lstrip().lower()
        if lowered.startswith(("<!doctype html", "<html")) or "<html" in lowered[:200]:
            return "is an HTML page, not a checkpoint (a download that fetched a web page, e.g. a login or error page?)"
        return f"is a text file, not a checkpoint (it starts with {_shown(text)})"
    return f"is not a checkpoint: its {size} bytes are in no format torch writes (starting {head[:8].hex(' ')})"
