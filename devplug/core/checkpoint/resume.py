"""Resuming a run: which checkpoint file, the damaged ones skipped, the newer ones set aside, and the record of it.

`choose` picks the file: an explicit checkpoint file is loaded as it is (a damaged one is an error);
a folder of ``step_NNNNNNN.pt`` files is tried newest first, skipping damaged ones with a warning. Resuming
from an older checkpoint of the run's own folder moves the newer ones aside (the policy's `set_aside_newer`).
The Trainer returns what happened as a `Resumed` record, so a script can print its own lines.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from devplug.core.checkpoint.format import format_of, is_checkpoint
from devplug.core.checkpoint.policy import damaged, steps_newest_first
from devplug.core.errors import CheckpointError, NonFiniteLossError

log = logging.getLogger("devplug")


@attrs.frozen(kw_only=True)
class Resumed:
    """What ``trainer.resume()`` did (it returns ``None`` for a new run, when there was nothing to resume).

    - ``path``: the checkpoint loaded; ``step`` and ``epoch``: where the run continues from.
    - ``extra``: the checkpoint's ``extra`` values (what ``save(path, **extra)`` and the objects registered
      for checkpointing stored).
    - ``skipped``: ``(path, reason)`` for each damaged or non-finite newer checkpoint passed over, newest first.
    - ``set_aside`` / ``set_aside_count``: the ``abandoned-<time>/`` folder the newer checkpoints were moved
      into, and how many (``None`` and 0 when there were none).
    """

    path: Path
    step: int
    epoch: int
    extra: dict[str, Any] = attrs.field(factory=dict, repr=False, eq=False)
    skipped: tuple[tuple[Path, str], ...] = ()
    set_aside: Path | None = None
    set_aside_count: int = 0


@attrs.frozen
class Choice:
    """The file `choose` loaded, its ``extra``, and the damaged files passed over on the way."""

    path: Path
    extra: dict[str, Any]
    skipped: tuple[tuple[Path, str], ...] = ()


def choose(source: Path, load: Callable[[Path], dict[str, Any]], *, explicit: bool) -> Choice | None:
    """Load the checkpoint ``source`` names: a file as it is, a folder's newest intact one.

    ``explicit``: the caller named ``source`` (a missing file or a folder without checkpoints is an error);
    otherwise it is the policy's folder, and an empty or missing folder is a new run (``None``). A
    checkpoint of another setup (`CheckpointMismatchError`) is an error, not a reason to go back.
    """
    if explicit and not source.exists():
        raise CheckpointError(f"checkpoint {str(source)!r} does not exist")
    if is_checkpoint(source):  # one checkpoint (a file, a sharded folder, ...), not a folder of them
        return Choice(source, load(source))
    found = [path for _step, path in steps_newest_first(source)]
    if not found:
        if explicit:
            raise CheckpointError(f"no checkpoint (step_*.pt) in {str(source)!r} to resume from")
        return None
    skipped: list[tuple[Path, str]] = []
    for path in found:
        try:
            return Choice(path, load(path), tuple(skipped))
        except (CheckpointError, NonFiniteLossError) as exc:
            if not damaged(exc):
                raise
            log.warning("skipping damaged checkpoint %s: %s; trying the one before it", path.name, exc)
            skipped.append((path, str(exc)))
    raise CheckpointError(f"no usable checkpoint to resume from in {source}: "
                          f"{', '.join(path.name for path, _reason in skipped)} are damaged; move them away to "
                          "start afresh, or restore one from a backup")


def _check(path: Path) -> None:
    """Raise `CheckpointError` unless the checkpoint ``path`` (of any registered format) reads intact."""
    format_of(path).check(path)


def newest_intact(source: Path, *, explicit: bool) -> tuple[Path | None, tuple[tuple[Path, str], ...], str]:
    """For a sharded run, where every rank loads together: the checkpoint to resume from without loading it.

    ``source`` itself when it is one checkpoint (its load reports what is wrong with it), else the newest
    of its folder whose files are intact, the damaged ones passed over with a warning. Returns the
    checkpoint (``None`` when there is none), the ``(path, reason)`` passed over, and a one-line problem
    (``""`` when none) that every rank raises, so no rank raises alone.
    """
    if is_checkpoint(source):
        return source, (), ""
    if explicit and not source.exists():
        return None, (), f"no checkpoint to resume from at {str(source)!r}"
    found = [path for _step, path in steps_newest_first(source)]
    if not found:
        return None, (), f"no checkpoint to resume from at {str(source)!r}" if explicit else ""
    skipped: list[tuple[Path, str]] = []
    for path in found:
        try:
            _check(path)
            return path, tuple(skipped), ""
        except CheckpointError as exc:
            log.warning("skipping damaged checkpoint %s: %s; trying the one before it", path.name, exc)
            skipped.append((path, str(exc)))
    return None, tuple(skipped), (f"no usable checkpoint to resume from in {source}: "
                                  f"{', '.join(path.name for path, _reason in skipped)} are damaged; move them "
                                  "away to start afresh, or restore one from a backup")
