"""A training script's console when its reader goes away: ``python train.py | head`` must not lose the run.

Python ignores SIGPIPE, so once the reader of stdout (or stderr) has gone, the next write or flush raises
`BrokenPipeError`: at a log point in the middle of training, that error would end the run before its
checkpoint is written. `keep_running_without_reader` puts a thin wrapper in front of ``sys.stdout`` and
``sys.stderr``: at the first broken pipe the stream's file descriptor is pointed at ``os.devnull`` and the
run goes on, saving everything it would have; only the console lines nobody can read any more are dropped.
"""

from __future__ import annotations

import os
import sys
from typing import Any, TextIO


class ReaderTolerantStream:
    """``stream`` (a text stream on a file descriptor) whose writes and flushes survive the reader leaving."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self.reader_gone = False

    def _drop_the_rest(self) -> None:
        """Point the descriptor at ``os.devnull``: what is buffered and what follows is written nowhere."""
        self.reader_gone = True
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, self._stream.fileno())
        finally:
            os.close(devnull)

    def write(self, text: str) -> int:
        """Write ``text``; after the reader has gone, nothing (the length is returned all the same)."""
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._drop_the_rest()
            return len(text)

    def flush(self) -> None:
        """Flush the stream; the reader having gone is not an error."""
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._drop_the_rest()
            self._stream.flush()  # the buffered text goes to os.devnull now, so the buffer is empty again

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def keep_running_without_reader() -> None:
    """Wrap ``sys.stdout`` and ``sys.stderr`` (where they are streams on a descriptor) in `ReaderTolerantStream`."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is None or isinstance(stream, ReaderTolerantStream):
            continue
        try:
            stream.fileno()
        except (AttributeError, OSError, ValueError):  # not a real descriptor (captured by a test harness)
            continue
        setattr(sys, name, ReaderTolerantStream(stream))
