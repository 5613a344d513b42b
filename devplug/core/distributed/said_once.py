"""One error line per job, not one per rank: the other ranks stay quiet when rank 0 already said the same.

Most errors of a launched job are found by every rank alike (a flag that does not fit, a damaged checkpoint,
an output folder another run holds), and each rank printing the same line makes a job of eight processes
print it eight times. Through the process group's own key-value store (shared by the job's ranks, and
private to one restart attempt under torch elastic), rank 0 publishes the line it prints; another rank
prints its line only when rank 0 did not say the same one within a few seconds, so a line only one rank
has (its own reason, a rank-specific fault) is never lost.
"""

from __future__ import annotations

import sys
from datetime import timedelta
from typing import Any

#: The store key under which rank 0 publishes the error line it printed.
KEY = "devplug/error-line"
#: How long another rank waits for rank 0's line before printing its own, in seconds.
WAIT_SECONDS = 5.0


def _default_store() -> tuple[Any, int] | None:
    """The joined default process group's store and this rank, or ``None`` outside a group of several ranks."""
    distributed = sys.modules.get("torch.distributed")  # never imported here: a run that joined one imported it
    if distributed is None or not distributed.is_available() or not distributed.is_initialized():
        return None
    try:
        if distributed.get_world_size() < 2:
            return None
        return distributed.distributed_c10d._get_default_store(), distributed.get_rank()
    except (RuntimeError, AttributeError, ValueError):
        return None


def said_by_rank_zero(line: str, *, store: Any = None, rank: int | None = None,
                      wait: float = WAIT_SECONDS) -> bool:
    """True when this process need not print ``line``: it is not rank 0, and rank 0 of its job printed the same.

    On rank 0 this publishes ``line`` and returns False (rank 0 always prints). Outside a process group of
    several ranks, or when the store cannot be reached (rank 0 gone with it), False: print. ``store`` and
    ``rank`` default to the joined default process group's.
    """
    if store is None or rank is None:
        found = _default_store()
        if found is None:
            return False
        store, rank = found
    try:
        if rank == 0:
            store.set(KEY, line)
            return False
        store.wait([KEY], timedelta(seconds=wait))
        said = store.get(KEY)
    except Exception:  # a store that is gone or slow: this rank's line is printed, as without a store
        return False
    return bool(said.decode("utf-8", "replace") == line)
