"""A watchdog over the hooks a training thread runs: a slow hook is named, a stuck one fails the run clearly.

Hooks run at every step (moving batches, marking steps, regions, clipping) cannot each run under a time
limit without costing every step a thread hand-off. Instead one daemon thread per process samples the
stacks of the threads that train (``sys._current_frames``, see `.guard.running_hook`), a few times per
second at most: the step itself pays nothing. A hook implementation found running in the same call for
longer than ``DEVPLUG_HOOK_WARN_SECONDS`` (default `DEFAULT_WARN_SECONDS`) is named in a warning, once
per hook; past ``DEVPLUG_HOOK_TIMEOUT`` (default `DEFAULT_HARD_SECONDS`) a `PluginError` naming it is
raised in the training thread, and when the hook is blocked where no Python runs (so the error cannot be
delivered) the process ends with that message and exit status `EXIT_STUCK` rather than hang silently.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
import threading
import time
from collections.abc import Mapping

from devplug.core.errors import PluginError
from devplug.core.registry.guard import HookLabel, running_hook_frame
from devplug.core.validators import seconds_from_environment

log = logging.getLogger("devplug")

ENV_WARN = "DEVPLUG_HOOK_WARN_SECONDS"
ENV_HARD = "DEVPLUG_HOOK_TIMEOUT"
#: Seconds a hook call may run before it is named in a warning.
DEFAULT_WARN_SECONDS = 60.0
#: Seconds a hook call may run before the run fails (a lazy-mode graph compile can take minutes).
DEFAULT_HARD_SECONDS = 900.0
#: Exit status of a process ended because a hook stayed stuck past the hard limit.
EXIT_STUCK = 70


class StuckHookError(PluginError):
    """A hook ran past the hard limit (``DEVPLUG_HOOK_TIMEOUT``); the message names it.

    Raised inside the stuck thread by the watchdog, which can hand over a class only: the message is
    looked up by thread.
    """

    def __init__(self, *args: object) -> None:
        super().__init__(*(args or (stuck_message(threading.get_ident()),)))


def limits(environ: Mapping[str, str] | None = None) -> tuple[float, float]:
    """The warning and hard limits in seconds (``DEVPLUG_HOOK_WARN_SECONDS``, ``DEVPLUG_HOOK_TIMEOUT``)."""
    return (seconds_from_environment(ENV_WARN, DEFAULT_WARN_SECONDS, environ),
            seconds_from_environment(ENV_HARD, DEFAULT_HARD_SECONDS, environ))


class Watchdog:
    """Samples the watched threads' stacks; names a slow hook call, fails a stuck one."""

    def __init__(self, warn: float, hard: float) -> None:
        self.warn, self.hard = warn, hard
        self._watched: dict[int, int] = {}  # thread id -> how many trainers watch it
        self._seen: dict[int, tuple[int, float, HookLabel]] = {}  # thread id -> (call number, first seen, label)
        self._warned: set[int] = set()  # the calls named already
        self._failed: dict[int, float] = {}  # thread id -> when the error was sent
        self._warned_hooks: set[str] = set()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="devplug hook watchdog", daemon=True)
        self._thread.start()

    @property
    def interval(self) -> float:
        """Seconds between samples: a quarter of the warning limit, between 0.05 and 1."""
        return min(1.0, max(0.05, self.warn / 4))

    def watch(self, thread_id: int) -> None:
        """Watch ``thread_id`` (once more)."""
        with self._lock:
            self._watched[thread_id] = self._watched.get(thread_id, 0) + 1

    def unwatch(self, thread_id: int) -> None:
        """Stop watching ``thread_id`` for one trainer."""
        with self._lock:
            left = self._watched.get(thread_id, 0) - 1
            if left > 0:
                self._watched[thread_id] = left
            else:
                self._watched.pop(thread_id, None)
                self._seen.pop(thread_id, None)
                self._failed.pop(thread_id, None)

    def forget_warnings(self) -> None:
        """Warn again about hooks already named (each hook is named once per process otherwise)."""
        self._warned_hooks.clear()

    def _run(self) -> None:
        while True:
            self._wake.wait(self.interval)
            try:
                self.sample(time.monotonic())
            except Exception as exc:  # the watchdog must never die: a missed sample is harmless
                log.debug("hook watchdog sample failed: %s", exc)

    def sample(self, now: float) -> None:
        """Look at each watched thread once: what hook call it is in, since when."""
        with self._lock:
            threads = list(self._watched)
        for thread_id in threads:
            found = running_hook_frame(thread_id)
            if found is None:
                self._seen.pop(thread_id, None)
                continue
            label, call = found
            seen = self._seen.get(thread_id)
            if seen is None or seen[0] != call:
                self._seen[thread_id] = (call, now, label)
                self._warned.clear()
                continue
            elapsed = now - seen[1]
            if elapsed >= self.hard:
                self._fail(thread_id, label, elapsed, now)
            elif elapsed >= self.warn and call not in self._warned:
                self._warned.add(call)
                if str(label) not in self._warned_hooks:
                    self._warned_hooks.add(str(label))
                    log.warning("%s has been running for %.1f s (%s warns at %g s, %s fails the run at %g s); "
                                "report the slow hook to the maintainers of %s", label, elapsed, ENV_WARN, self.warn,
                                ENV_HARD, self.hard, label.distribution)

    def message(self, label: HookLabel, elapsed: float) -> str:
        """The error for a hook call stuck past the hard limit."""
        return (f"{label} did not return within {self.hard:g} s (it has run {elapsed:.0f} s; {ENV_HARD} sets the "
                f"limit); the run was stopped rather than left hanging; report this to the maintainers of "
                f"{label.distribution}")

    def _fail(self, thread_id: int, label: HookLabel, elapsed: float, now: float) -> None:
        text = self.message(label, elapsed)
        sent = self._failed.get(thread_id)
        if sent is None:
            self._failed[thread_id] = now
            log.error("%s", text)
            _StuckMessages.by_thread[thread_id] = text
            _raise_in(thread_id, StuckHookError)
            return
        if now - sent >= min(self.hard, 5.0):  # blocked where no Python runs: the error cannot be delivered
            sys.stderr.write(f"devplug: error: {text}\n")
            sys.stderr.flush()
            os._exit(EXIT_STUCK)


class _StuckMessages:
    by_thread: dict[int, str] = {}


def _raise_in(thread_id: int, error: type[BaseException]) -> None:
    """Raise ``error`` in thread ``thread_id`` the next time it runs Python code."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), ctypes.py_object(error))


_watchdog: Watchdog | None = None
_start_lock = threading.Lock()


def watchdog() -> Watchdog:
    """The process's watchdog, started on first use with the limits from the environment."""
    global _watchdog
    with _start_lock:
        warn, hard = limits()
        if _watchdog is None:
            _watchdog = Watchdog(warn, hard)
        else:
            _watchdog.warn, _watchdog.hard = warn, hard
        return _watchdog


def stuck_message(thread_id: int) -> str:
    """The message of the stuck-hook error sent to ``thread_id`` (the error itself carries no text)."""
    return _StuckMessages.by_thread.get(thread_id, f"a hook ran past {ENV_HARD}")
