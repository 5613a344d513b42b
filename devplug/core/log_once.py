"""Saying a thing once per process (a fallback and its reason), not once per call."""

from __future__ import annotations

import logging

_logged: set[str] = set()


def log_once(message: str, level: int = logging.INFO, *, logger: str = "devplug") -> None:
    """Log ``message`` on ``logger`` at ``level`` the first time it comes up in this process."""
    if message not in _logged:
        _logged.add(message)
        logging.getLogger(logger).log(level, "%s", message)


def forget_logged() -> None:
    """Forget which messages `log_once` has logged (tests)."""
    _logged.clear()
