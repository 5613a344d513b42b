"""Stopping a run at a step boundary on Ctrl-C, SIGTERM (SLURM, Kubernetes, ``docker stop``) or SIGUSR1.

While ``Trainer.epochs()`` runs, the Trainer's stop signals (``TrainerConfig.stop_signals``) only set a
flag: the primary training loader then ends the epoch before the next step begins, ``epochs()`` stops,
and the author's code after the loop saves a checkpoint and writes its summary as after any run; the
process should then exit with ``trainer.exit_code`` (``128 + signal number``: 130 for SIGINT, 143 for
SIGTERM, 138 for SIGUSR1, so a scheduler sees a pre-empted run, not a finished one). A second signal of
the same kind stops at once, as without devplug. Outside ``epochs()`` signals keep their usual meaning.

Under several processes every rank must stop at the same step, though the signal reaches them at
different moments: the flag is combined across ranks (a one-integer all-reduce over a CPU ``gloo``
group, no device synchronisation) each time the primary loader is about to start a step. A rank that
learned of the stop from another rank may still receive its own copy of the signal (a scheduler signals
every task, a moment apart): that copy is its first signal, not a second, even after ``epochs()`` has
ended, so it cannot kill the rank while it saves.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from types import FrameType
from typing import TYPE_CHECKING, Any

from devplug.core.errors import ConfigError

if TYPE_CHECKING:
    from devplug.core.distributed.combine import RankCombiner

log = logging.getLogger("devplug")

#: Signals a Trainer turns into a stop request by default.
DEFAULT_STOP_SIGNALS = ("SIGINT", "SIGTERM", "SIGUSR1")
#: Across ranks a signal is sent as this plus its number, above any request (``1 + rank``).
SIGNAL_CODE = 1000


def signal_numbers(names: Sequence[str]) -> list[int]:
    """``["SIGTERM"]`` → ``[15]``; an unknown name (or one this platform lacks) is a ConfigError."""
    numbers = []
    for name in names:
        spelled = str(name).upper()
        spelled = spelled if spelled.startswith("SIG") else f"SIG{spelled}"
        number = getattr(signal, spelled, None)
        if not isinstance(number, signal.Signals):
            raise ConfigError(f"stop_signals names {name!r}, which is not a signal here; use names such as "
                              "'SIGINT', 'SIGTERM', 'SIGUSR1'")
        numbers.append(int(number))
    return numbers


class StopRequest:
    """The stop flag of one Trainer: set by a stop signal or a request, combined across ranks when asked.

    Across ranks the flag travels as one integer, the largest wins: 0 (go on), ``1 + rank`` (a request from
    that rank, by `request_stop`) or ``1000 + signal number`` (a signal outranks a request).
    """

    def __init__(self, signals: Sequence[str], combiner: RankCombiner | None = None) -> None:
        self.numbers = signal_numbers(signals)
        self.received: int | None = None
        self.reason: str | None = None
        self.agreed = False
        self._requested = False
        self._combiner = combiner
        self.signalled = False  # this process received a stop signal itself (not only from another rank)
        self._kinds: set[int] = set()  # the stop signals received while handling (a second of one stops at once)
        self._after: dict[int, Any] = {}  # the handlers a late signal gives back (see _late)

    @property
    def signal_name(self) -> str | None:
        """The name of the signal that asked to stop (``"SIGTERM"``), or ``None``."""
        return signal.Signals(self.received).name if self.received is not None else None

    @property
    def exit_code(self) -> int:
        """``128 + signal number`` once a stop signal was received (130, 143, 138), else 0."""
        return 128 + self.received if self.received is not None else 0

    def request(self, signum: int = signal.SIGTERM) -> None:
        """Ask to stop at the next step boundary, as the signal ``signum`` would."""
        if self.received is None:
            self.received = int(signum)
            self.reason = f"{signal.Signals(signum).name} received"

    def request_stop(self, reason: str) -> None:
        """Ask to stop at the next step boundary for ``reason`` (no signal: the exit code stays 0)."""
        if not self._requested and self.received is None:
            self._requested, self.reason = True, reason

    def _code(self, rank: int) -> int:
        if self.received is not None:
            return SIGNAL_CODE + self.received
        return 1 + rank if self._requested else 0

    def should_stop(self, rank: int = 0) -> bool:
        """True once any rank was asked to stop (a collective when several processes run: call it on all)."""
        if self.agreed:
            return True
        code = self._code(rank)
        if self._combiner is not None:
            code = self._combiner.max(code)
            if code and code < SIGNAL_CODE:  # a request: every rank learns its reason from the rank that made it
                self.reason = self._combiner.broadcast(self.reason, source=code - 1)
            elif code and self.received is None:
                self.received = code - SIGNAL_CODE  # another rank got the signal
                self.reason = f"{signal.Signals(self.received).name} received on another rank"
        self.agreed = code != 0
        return self.agreed

    def checker(self, rank: int) -> Callable[[], bool]:
        """`should_stop` for ``rank`` as a function of no arguments, for the check at every step boundary.

        In one process (no combiner) nothing else is asked until a signal or a request arrives; across ranks
        every check is the collective `should_stop` is.
        """
        if self._combiner is not None:
            return functools.partial(self.should_stop, rank)

        def local() -> bool:
            if self.received is None and not self._requested and not self.agreed:
                return False
            return self.should_stop(rank)

        return local

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if signum in self._kinds:  # a second signal of this kind: stop at once, as without devplug
            previous = self._previous.get(signum, signal.SIG_DFL)
            signal.signal(signum, previous)
            if callable(previous):
                previous(signum, frame)
            else:
                os.kill(os.getpid(), signum)
            return
        self._kinds.add(signum)
        name = signal.Signals(signum).name
        if self.signalled:  # another kind (SLURM's early signal, then SIGTERM at the limit): already stopping
            print(f"\ndevplug: {name} received: already stopping (send it again to stop at once)",
                  file=sys.stderr, flush=True)
            return
        self.signalled, self.received = True, signum
        self.reason = f"{name} received"
        print(f"\ndevplug: {name} received: stopping after this step and saving (send it again to stop at once)",
              file=sys.stderr, flush=True)

    def _late(self, signum: int, frame: FrameType | None) -> None:
        # epochs() ended on another rank's stop; this rank's own copy of the signal arrives now: note it, and
        # give every stop signal its previous meaning back, so that a second one acts as without devplug
        for number, previous in self._after.items():
            signal.signal(number, previous)
        self._after = {}
        self.signalled, self.received = True, signum
        print(f"\ndevplug: {signal.Signals(signum).name} received: already stopping (send it again to stop at once)",
              file=sys.stderr, flush=True)

    @contextmanager
    def handling(self) -> Iterator[None]:
        """Turn this Trainer's stop signals into a stop request inside (main thread only)."""
        self._previous: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for number in self.numbers:
                self._previous[number] = signal.signal(number, self._handle)
        try:
            yield
        finally:
            # stopped for another rank's signal: this rank's own copy may follow (a request sends none)
            late = self.agreed and not self.signalled and self.received is not None
            self._after = dict(self._previous) if late else {}
            for number, previous in self._previous.items():
                signal.signal(number, self._late if late else previous)
            self._previous = {}
