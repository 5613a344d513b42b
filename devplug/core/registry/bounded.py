"""Calls into plugins that may never return: run in a daemon thread, stop waiting after a time limit.

The one-time questions devplug asks plugins (an availability probe, a doctor contribution, the precision
plan) run through `BoundedCall`. Python cannot stop a thread, so a call that outlives its limit
keeps running in the background and its answer is ignored; its thread is a daemon, so it never holds up
the interpreter's exit. The limit is ``DEVPLUG_PROBE_TIMEOUT`` seconds (default
`DEFAULT_TIME_LIMIT`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from devplug.core.errors import PluginError
from devplug.core.registry.guard import HookLabel, running_hook
from devplug.core.validators import seconds_from_environment

ENV_TIME_LIMIT = "DEVPLUG_PROBE_TIMEOUT"
#: Seconds a probe may take by default: generous for a vendor runtime that loads or a GPU driver that wakes up.
DEFAULT_TIME_LIMIT = 10.0


def time_limit(environ: Mapping[str, str] | None = None) -> float:
    """The time limit in seconds: ``DEVPLUG_PROBE_TIMEOUT`` (a positive number), else `DEFAULT_TIME_LIMIT`."""
    return seconds_from_environment(ENV_TIME_LIMIT, DEFAULT_TIME_LIMIT, environ)


def seconds(value: float) -> str:
    """``"1 s"``, ``"2.5 s"``: a limit as the messages show it."""
    return f"{value:g} s"


class BoundedCall:
    """``function()`` running in a daemon thread, started at once; wait for its answer up to a limit.

    ``before`` runs first in the thread (to carry over per-thread state the call depends on).
    """

    def __init__(self, function: Callable[[], Any], name: str, *, before: Callable[[], None] | None = None) -> None:
        self.started = time.monotonic()
        self._done = threading.Event()
        self._value: Any = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(function, before), name=f"devplug {name}",
                                        daemon=True)
        self._thread.start()

    def _run(self, function: Callable[[], Any], before: Callable[[], None] | None) -> None:
        try:
            if before is not None:
                before()
            self._value = function()
        except BaseException as exc:  # handed to the caller, who decides what a failure means
            self._error = exc
        finally:
            self._done.set()

    @property
    def done(self) -> bool:
        """True once the call has answered or raised."""
        return self._done.is_set()

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds; True when the call has finished (answered or raised)."""
        return self._done.wait(max(timeout, 0.0))

    def wait_until(self, deadline: float) -> bool:
        """Wait until ``deadline`` (a ``time.monotonic()`` value); True when the call has finished."""
        return self.wait(deadline - time.monotonic())

    def result(self) -> Any:
        """The answer of a finished call, or the exception it raised, raised again."""
        if self._error is not None:
            raise self._error
        return self._value

    def running_hook(self) -> HookLabel | None:
        """The hook implementation the unfinished call is inside now, if any (see `.guard.running_hook`)."""
        return running_hook(self._thread.ident)


def call_with_limit(function: Callable[[], Any], what: str, *, limit: float | None = None,
                    before: Callable[[], None] | None = None) -> Any:
    """``function()``'s answer, or a `PluginError` naming the plugin when it takes longer than ``limit``.

    ``limit`` defaults to `time_limit`; ``what`` names the call when no plugin's hook is found
    running (``"devplug_precision"``).
    """
    limit = time_limit() if limit is None else limit
    call = BoundedCall(function, what, before=before)
    if not call.wait(limit):
        label = call.running_hook()
        who = str(label) if label is not None else what
        blame = f"; report this to the maintainers of {label.distribution}" if label is not None else ""
        raise PluginError(f"{who} did not answer within {seconds(limit)} ({ENV_TIME_LIMIT} sets the limit){blame}")
    return call.result()
