"""devplug's warnings as the example's own lines: ``dcgan: warning: ...`` on stderr, one line each.

devplug reports what it does on its own (a checkpoint not saved because the weights are non-finite, a
mid-epoch resume on a loader whose order it does not control) through the ``devplug`` logger. The example
prints those warnings in its own format while it trains, and keeps them quiet where it prints what they say
itself (resuming: it prints from the `devplug.Resumed` record).
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator

from devplug.toolkit import printable

LOGGER = "devplug"


class _Printed(logging.Handler):
    """Print each warning as one ``dcgan: warning:`` line on the stderr of the moment."""

    def emit(self, record: logging.LogRecord) -> None:
        print(f"dcgan: warning: {printable(' '.join(record.getMessage().split()))}", file=sys.stderr)


@contextlib.contextmanager
def library_warnings_printed(enabled: bool = True) -> Iterator[None]:
    """Inside the block, devplug's warnings are printed as the example's lines (``enabled``: the main process)."""
    if not enabled:
        yield
        return
    handler = _Printed(logging.WARNING)
    logger = logging.getLogger(LOGGER)
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)


@contextlib.contextmanager
def library_warnings_off() -> Iterator[None]:
    """Inside the block, devplug's warnings are not printed: the example prints what they say itself."""
    logger = logging.getLogger(LOGGER)
    before = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(before)
