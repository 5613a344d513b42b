"""A run's checkpoint policy: when to save, which files to keep, where to resume from.

A `CheckpointPolicy` given to the Trainer (``Trainer(checkpoints=...)``) saves ``step_NNNNNNN.pt``
files into one folder every N steps and/or every T minutes (at step boundaries only, so every checkpoint
resumes bitwise), and at the end of ``epochs()``. It keeps the newest ``keep_last`` files and the best
``keep_best`` by a logged metric, and never removes the newest intact checkpoint. With ``auto_resume`` the
run continues from the newest checkpoint that loads: damaged or non-finite files are skipped with a
warning and the one before is tried; resuming from an older one moves the newer ones aside into
``abandoned-<time>/`` (never deleted), so they are neither pruned nor resumed by mistake later; so does a
save that finds checkpoints of its step or later in the folder (another run's, in a folder reused without
resuming).

`RunCheckpoints` does the file work for one policy (saving, pruning); `devplug.core.checkpoint.resume` chooses
the file to resume from; the Trainer decides when.
"""

from __future__ import annotations

import datetime
import itertools
import json
import logging
import math
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from devplug.core.checkpoint.diskfull import disk_full_cause, disk_full_line, write_atomically
from devplug.core.checkpoint.format import format_of
from devplug.core.checkpoint.tempfiles import remove_stale_temp_files
from devplug.core.errors import CheckpointError, CheckpointMismatchError, NonFiniteLossError

log = logging.getLogger("devplug")

#: The checkpoint files a policy writes and recognises.
CHECKPOINT_NAME = re.compile(r"^step_(\d+)\.pt$")
#: Beside them: the metric each checkpoint was saved with (for keep_best), rewritten atomically.
INDEX_NAME = "checkpoints.json"


def checkpoint_name(step: int) -> str:
    """The file name of the checkpoint taken after ``step`` steps."""
    return f"step_{step:07d}.pt"


def _optional_positive_int(_inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"{attribute.name} must be a positive integer or None, got {value!r}")


def _non_negative_int(_inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{attribute.name} must be a non-negative integer, got {value!r}")


def _optional_positive_number(_inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                              or not 0 < value < math.inf):
        raise ValueError(f"{attribute.name} must be a positive number of minutes or None, got {value!r}")


@attrs.frozen(kw_only=True)
class CheckpointPolicy:
    """When a Trainer saves checkpoints on its own, which it keeps, and whether it resumes.

    - ``directory``: the folder of ``step_NNNNNNN.pt`` files (created on the first save).
    - ``every_n_steps`` / ``every_minutes``: save at the first step boundary after every N steps and/or T
      minutes (``None``: not on that clock). Both ``None`` with ``at_end`` saves only at the end.
    - ``at_end``: save when ``epochs()`` ends normally or on a stop signal or request (not on an exception).
    - ``keep_last``: the newest files kept (``None`` keeps every file).
    - ``keep_best`` with ``monitor`` and ``mode``: also keep the best K by a value passed to ``trainer.log``
      (``"min"``: lower is better). A checkpoint is scored with the value of its own weights: the first
      value of ``monitor`` logged at its step (after that step's optimizer step, before the next one's),
      whether logged before or after the save; one without such a value is unscored.
    - ``auto_resume``: continue from the newest intact checkpoint of ``directory`` when the loop starts.
    """

    directory: str | os.PathLike[str] = attrs.field(converter=str)
    every_n_steps: int | None = attrs.field(default=None, validator=_optional_positive_int)
    every_minutes: float | None = attrs.field(default=None, validator=_optional_positive_number)
    at_end: bool = True
    keep_last: int | None = attrs.field(default=3, validator=_optional_positive_int)
    keep_best: int = attrs.field(default=0, validator=_non_negative_int)
    monitor: str | None = None
    mode: str = attrs.field(default="min", validator=attrs.validators.in_(("min", "max")))
    auto_resume: bool = False

    def __attrs_post_init__(self) -> None:
        if self.keep_best and not self.monitor:
            raise ValueError("keep_best needs monitor=, the name of a value you pass to trainer.log()")

    def due(self, step: int, last_saved_step: int, last_saved_time: float, now: float) -> bool:
        """True when a checkpoint should be taken at this step boundary."""
        if step <= last_saved_step:
            return False
        if self.every_n_steps is not None and step % self.every_n_steps == 0:
            return True
        return self.every_minutes is not None and now - last_saved_time >= self.every_minutes * 60


def steps_newest_first(folder: Path) -> list[tuple[int, Path]]:
    """The policy's checkpoint files in ``folder`` with their steps, newest first (none if it does not exist)."""
    if not folder.is_dir():
        return []
    found = [(int(match[1]), path) for path in folder.iterdir()
             if (match := CHECKPOINT_NAME.match(path.name)) and (path.is_file() or path.is_dir())]
    return sorted(found, reverse=True)


def _new_folder(parent: Path, name: str) -> Path:
    """Create ``parent/name``, or ``name-2``, ``name-3``... when it is taken: a folder no one else wrote into."""
    for number in itertools.count(1):
        folder = parent / (name if number == 1 else f"{name}-{number}")
        try:
            folder.mkdir()
        except FileExistsError:
            continue
        return folder
    raise AssertionError("unreachable")  # pragma: no cover


def set_aside_newer(resumed: Path, *, now: datetime.datetime | None = None) -> tuple[Path | None, int]:
    """Move the checkpoints newer than ``resumed`` in its folder into ``abandoned-<time>/`` beside them.

    They are never deleted, so they are neither pruned nor resumed from by mistake later; the folder is a new
    one each time (``abandoned-<time>-2/`` and so on when one of that second exists), so a file set aside
    earlier is never replaced. Returns that folder and how many were moved (``None`` and 0 when none were
    newer, or ``resumed`` is not a ``step_*.pt`` file).
    """
    match = CHECKPOINT_NAME.match(resumed.name)
    if match is None:
        return None, 0
    return set_aside_from(resumed.parent, int(match[1]) + 1, now=now,
                          why=f"resumed from an older checkpoint ({resumed.name})")


def set_aside_from(folder: Path, step: int, *, why: str,
                   now: datetime.datetime | None = None) -> tuple[Path | None, int]:
    """Move the checkpoints of ``folder`` taken at ``step`` or later into ``abandoned-<time>/`` beside them.

    ``why`` starts the warning that says so. Returns that folder and how many were moved (``None`` and 0 when
    there were none). A folder that cannot be written (read-only, another user's) is a warning, not an error:
    the checkpoints stay where they are.
    """
    newer = [path for found, path in steps_newest_first(folder) if found >= step]
    if not newer:
        return None, 0
    aside, moved = None, 0
    try:
        aside = _new_folder(folder, f"abandoned-{(now or datetime.datetime.now()).strftime('%Y%m%d-%H%M%S')}")
        for path in newer:
            path.rename(aside / path.name)
            moved += 1
    except OSError as exc:  # a folder this process cannot write (read-only, another user's): they stay
        log.warning("%s: could not move %d newer checkpoint(s) aside (%s); they stay where they are", why,
                    len(newer) - moved, exc.strerror or exc)
        if moved == 0:
            return None, 0
    log.warning("%s: moved %d newer checkpoint(s) to %s", why, moved, aside)
    return aside, moved


def damaged(exc: BaseException) -> bool:
    """True when a load failed because the file is damaged or holds NaN, not because it fits another setup."""
    return isinstance(exc, (CheckpointError, NonFiniteLossError)) and not isinstance(exc, CheckpointMismatchError)


def _unwritten(path: Path, exc: OSError, kept: str) -> str:
    """One line for a policy file that could not be written: a full disk (or quota), or a folder that takes no
    file (permission, a read-only file system); ``kept`` says what is intact."""
    full = disk_full_cause(exc)
    if full is not None:
        return f"{disk_full_line(str(path), full)}; {kept}; free some space or save the checkpoints on another disk"
    return (f"could not write {path} ({exc.strerror or exc}); {kept}; check that the folder can be written, or save "
            "the checkpoints elsewhere")


class RunCheckpoints:
    """The files of one `CheckpointPolicy`: saving, pruning, resuming (the main process writes)."""

    def __init__(self, policy: CheckpointPolicy) -> None:
        self.policy = policy
        self.folder = Path(policy.directory)
        self.last_saved_step = 0
        self.last_saved_time = time.monotonic()
        self.last_path: Path | None = None
        #: the step of the newest checkpoint while its score may still arrive (logged later at its step)
        self.awaiting: int | None = None

    # ---- the metric each checkpoint was saved with -----------------------------------------------------------
    def _read_index(self) -> dict[str, float]:
        try:
            scores = json.loads((self.folder / INDEX_NAME).read_text())
        except (OSError, ValueError):
            return {}  # missing or damaged: every checkpoint counts as unscored
        return {str(k): float(v) for k, v in scores.items() if isinstance(v, (int, float))} \
            if isinstance(scores, dict) else {}

    def has_scores(self) -> bool:
        """True when ``checkpoints.json`` holds the score of a checkpoint in the folder."""
        return any((self.folder / name).exists() for name in self._read_index())

    def _write_index(self, scores: dict[str, float]) -> None:
        if not scores:  # nothing scored (no monitor): no index file beside the checkpoints
            (self.folder / INDEX_NAME).unlink(missing_ok=True)
            return
        index = self.folder / INDEX_NAME
        text = json.dumps(scores, indent=1, sort_keys=True).encode()
        try:
            write_atomically(index, lambda handle: handle.write(text))  # whole or not at all, its temp file swept
        except OSError as exc:
            raise CheckpointError(_unwritten(index, exc, "the checkpoints and the previous index are intact")) from exc

    # ---- saving ----------------------------------------------------------------------------------------------
    def save(self, step: int, write: Callable[[Path], Any], score: float | None, *, main: bool = True) -> Path:
        """Write the checkpoint of ``step`` through ``write`` (atomic), record its score, then prune.

        A full disk (or quota), or a folder that takes no file (permission, a read-only file system), raises
        one `CheckpointError` line naming the file and the previous checkpoint, which the atomic write left
        intact; the same at the index of scores beside them (``checkpoints.json``). A sharded checkpoint (a
        folder every rank writes into) is written on every rank; only the ``main`` one records scores and prunes.
        Checkpoints of ``step`` or later already in the folder were written by another run (this one's steps only
        grow): they are moved into ``abandoned-<time>/`` first, so they neither replace nor outrank this run's.
        """
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / checkpoint_name(step)
        if main:
            set_aside_from(self.folder, step, why=f"this run saves its step {step} into {self.folder}, which holds "
                           "checkpoints of another run at that step or later")
        try:
            write(path)
        except OSError as exc:
            raise CheckpointError(_unwritten(path, exc, self._previous(path))) from exc
        self.last_saved_step, self.last_saved_time, self.last_path = step, time.monotonic(), path
        if not main:
            return path
        scores = self._read_index()
        scores.pop(path.name, None)
        if score is not None and math.isfinite(score):
            scores[path.name] = score
        self.awaiting = step if score is None and self.policy.monitor is not None else None
        self.prune(scores)
        return path

    def attach(self, step: int, score: float) -> bool:
        """Score the checkpoint of ``step``, saved before its value was logged; prune again. True if attached.

        Only the checkpoint still awaiting its score takes one (a value logged at its step, after the save).
        """
        if self.awaiting != step:
            return False
        self.awaiting = None
        path = self.folder / checkpoint_name(step)
        if not math.isfinite(score) or not path.exists():
            return False
        scores = self._read_index()
        scores[path.name] = score
        self.prune(scores)
        return True

    def _previous(self, path: Path) -> str:
        previous = next((found for _step, found in steps_newest_first(self.folder) if found != path), None)
        return f"the previous checkpoint {previous} is intact" if previous else "no earlier checkpoint was touched"

    def keep(self, scores: dict[str, float]) -> set[Path]:
        """The files the policy keeps: the newest (always), the last ``keep_last``, the best ``keep_best``.

        A checkpoint whose score may still arrive is never pruned in favour of a scored one.
        """
        found = steps_newest_first(self.folder)
        if not found:
            return set()
        policy = self.policy
        kept = {path for _step, path in (found if policy.keep_last is None else found[:policy.keep_last])}
        kept.add(found[0][1])
        kept.update(path for step, path in found if step == self.awaiting)
        if policy.keep_best:
            scored = [(scores[path.name], -step, path) for step, path in found if path.name in scores]
            scored.sort(key=lambda item: (item[0] if policy.mode == "min" else -item[0], item[1]))
            kept.update(path for _score, _step, path in scored[:policy.keep_best])
        return kept

    def prune(self, scores: dict[str, float] | None = None) -> list[Path]:
        """Remove the checkpoints the policy does not keep; the paths removed."""
        scores = self._read_index() if scores is None else scores
        kept = self.keep(scores)
        removed = [path for _step, path in steps_newest_first(self.folder) if path not in kept]
        for path in removed:
            format_of(path).remove(path)  # a file, a sharded folder, or another format's checkpoint
        self._write_index({name: value for name, value in scores.items() if self.folder / name in kept})
        remove_stale_temp_files(self.folder)
        return removed

    # ---- resuming --------------------------------------------------------------------------------------------
    def resumed_from(self, path: Path, step: int) -> None:
        """Count ``path``, the checkpoint of ``step``, as the last save: the next one is due from there on."""
        self.last_saved_step = step
        self.last_saved_time = time.monotonic()
        self.last_path = path
