"""The text: Python's own standard library source, read as bytes (a 256-symbol vocabulary, nothing to download).

Every Python installation has it, under ``sysconfig.get_paths()["stdlib"]``. The file list is deterministic:
every ``*.py`` file under that folder (``site-packages`` and ``__pycache__`` left out), taken in the order
of the SHA-256 of its relative path (a spread over the whole library rather than its first letters of the
alphabet) until ``--corpus-mb`` is reached. A file goes to the evaluation text when the same hash says so
(one file in ten), so evaluation measures held-out files, never text the model trained on. Files are
joined with a blank line. Reading a few MB takes well under a second, so nothing is cached.

`Windows` turns a text into training samples: ``context + 1`` consecutive bytes (inputs and next-byte
targets), the training text cut into non-overlapping windows that the Trainer's loader shuffles (each rank
its own share, a resumed run continuing the interrupted run's order); the evaluation windows are spread
evenly over the held-out text.
"""

from __future__ import annotations

import hashlib
import os
import sys
import sysconfig
from pathlib import Path

import attrs
import torch
from torch.utils.data import Dataset

from devplug import DataError

#: One file in this many goes to the evaluation text.
EVAL_SHARE = 10
#: No single file takes more than this share of the corpus (one huge generated file would dominate it).
LARGEST_FILE_SHARE = 8
SKIPPED_FOLDERS = ("site-packages", "__pycache__")
#: Between two files.
SEPARATOR = b"\n\n"


def _digest(relative: str) -> str:
    return hashlib.sha256(relative.encode("utf-8", "surrogateescape")).hexdigest()


def is_eval_file(relative: str) -> bool:
    """True when the file at ``relative`` (a path under the library folder, ``/``-separated) is held out."""
    return int(_digest(relative)[:8], 16) % EVAL_SHARE == 0


@attrs.frozen
class Corpus:
    """The training and evaluation texts as uint8 tensors, and where they came from."""

    root: Path
    train: torch.Tensor
    eval: torch.Tensor
    train_files: int
    eval_files: int

    @property
    def description(self) -> str:
        """One line: the source, the file counts and sizes."""
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        return (f"Python {version} standard library source ({self.root}): {self.train_files} files, "
                f"{len(self.train):,} bytes to train on; {self.eval_files} held-out files, {len(self.eval):,} bytes "
                "to evaluate on")


def library_files(root: Path) -> list[str]:
    """Every ``*.py`` file under ``root`` as a ``/``-separated relative path, in hash order."""
    found = []
    for folder, subfolders, names in os.walk(root):
        subfolders[:] = sorted(name for name in subfolders if name not in SKIPPED_FOLDERS)
        base = Path(folder).relative_to(root)
        found += [(base / name).as_posix() for name in names if name.endswith(".py")]
    return sorted(found, key=lambda relative: (_digest(relative), relative))


def load_corpus(max_bytes: int, root: Path | None = None) -> Corpus:
    """The corpus of at most ``max_bytes`` bytes from the standard library at ``root`` (default: this Python's).

    Raises `devplug.DataError` when the folder holds no source or too little for a training and an
    evaluation text.
    """
    root = Path(root if root is not None else sysconfig.get_paths()["stdlib"])
    if not root.is_dir():
        raise DataError(f"the Python standard library source is not at {str(root)!r}: this Python ships without "
                        "it, and the example trains on it")
    largest = max(max_bytes // LARGEST_FILE_SHARE, 1)
    parts: dict[bool, list[bytes]] = {True: [], False: []}
    total = 0
    for relative in library_files(root):
        path = root / relative
        try:
            size = path.stat().st_size
            if size == 0 or size > largest or total + size + len(SEPARATOR) > max_bytes:
                continue
            data = path.read_bytes()
        except OSError:
            continue  # unreadable: the list stays deterministic for a given library
        parts[is_eval_file(relative)].append(data)
        total += len(data) + len(SEPARATOR)
    train, held_out = SEPARATOR.join(parts[False]), SEPARATOR.join(parts[True])
    if not train or not held_out:
        raise DataError(f"the standard library at {str(root)!r} gave {len(parts[False])} training and "
                        f"{len(parts[True])} held-out files within --corpus-mb: raise --corpus-mb")
    return Corpus(root=root, train=_bytes(train), eval=_bytes(held_out), train_files=len(parts[False]),
                  eval_files=len(parts[True]))


def _bytes(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


class Windows(Dataset[torch.Tensor]):
    """Samples of ``context + 1`` consecutive bytes of ``text`` (int64), starting at ``starts``."""

    def __init__(self, text: torch.Tensor, context: int, starts: torch.Tensor) -> None:
        self.text, self.context, self.starts = text, context, starts

    @classmethod
    def tiling(cls, text: torch.Tensor, context: int) -> Windows:
        """``text`` cut into non-overlapping windows (the training samples)."""
        return cls(text, context, torch.arange(0, len(text) - context, context))  # the last may end on the last byte

    @classmethod
    def spread(cls, text: torch.Tensor, context: int, count: int) -> Windows:
        """``count`` windows spread evenly over ``text`` (as many as fit when fewer do; the evaluation samples)."""
        last = len(text) - context - 1
        count = max(min(count, last // max(context, 1) + 1), 0) if last >= 0 else 0
        starts = torch.linspace(0, last, count).long() if count > 1 else torch.zeros(count, dtype=torch.long)
        return cls(text, context, starts)

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, index: int) -> torch.Tensor:
        start = int(self.starts[index])
        return self.text[start:start + self.context + 1].long()
