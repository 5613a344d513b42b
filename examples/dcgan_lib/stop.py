"""Ctrl-C during training: the first one finishes the current step and stops cleanly (sample,
checkpoint, summary); a second one stops at once (summary only).

Only for single-process runs: under torchrun every rank would have to agree on the step to stop at,
which costs a collective per step, so there Ctrl-C keeps its usual meaning (stop at once).
"""

from __future__ import annotations

import signal
import sys
import threading
from types import FrameType
from typing import Any


class StopRequest:
    """A context manager that turns the first SIGINT into ``requested = True``."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.requested = False
        self._previous: Any = None

    def __enter__(self) -> StopRequest:
        if self.enabled and threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        print("\ndcgan: stopping after this step (Ctrl-C again to stop at once)", file=sys.stderr, flush=True)

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None
