"""A Trainer's checkpoints over a run: what rides along, saving and loading, resuming, and the policy's saves.

`CheckpointKeeper` holds what the Trainer's ``save``, ``load``, ``resume``, ``checkpoint_now`` and
``register_for_checkpointing`` do, so the Trainer only delegates. It holds one checkpoint format
(`devplug.core.checkpoint.format`: a plain file rank 0 writes, a sharded folder every rank writes, or a
registered one) and loads whatever format a checkpoint is in; a resume is chosen on rank 0 and loaded on
every rank (together, for a collective format); the checkpoint policy (`RunCheckpoints`) says when to
save and what to keep.
"""

from __future__ import annotations

import logging
import os
import time
import warnings
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from devplug.core.errors import CheckpointError, ConfigError, DevplugError, NonFiniteLossError

if TYPE_CHECKING:  # the policy, resume and file modules load with the first save, load or resume
    from devplug.core.checkpoint.format import CheckpointFormat
    from devplug.core.checkpoint.policy import RunCheckpoints
    from devplug.core.checkpoint.resume import Resumed
    from devplug.core.distributed.combine import RankCombiner
    from devplug.core.loop.trainer_state import TrainerState

log = logging.getLogger("devplug")


class CheckpointKeeper:
    """Saves, loads and resumes a Trainer's state, and saves by its checkpoint policy.

    ``checkpoint_format``: how this run saves (chosen once, by its strategy or the author); ``combiner``: the
    ranks' object collectives (``None`` in one process); ``nonfinite`` is the Trainer's setting for a
    diverged run; ``stepped`` the optimizers the Trainer's ``step`` was given (one a checkpoint would miss is named);
    ``policy_save`` writes the policy's checkpoints (the Trainer's own ``save``, so a subclass's is used);
    ``bookkeeping`` takes the seconds the policy then spends on its index and pruning, which are not training.
    """

    def __init__(self, state: TrainerState, runs: RunCheckpoints | None, *, checkpoint_format: CheckpointFormat,
                 combiner: RankCombiner | None, is_main: bool, nonfinite: str,
                 stepped: weakref.WeakSet[torch.optim.Optimizer], policy_save: Callable[[Path], Any],
                 bookkeeping: Callable[[float], None] = lambda _seconds: None) -> None:
        self.state, self.runs, self._stepped, self._policy_save = state, runs, stepped, policy_save
        self._bookkeeping = bookkeeping
        self.format, self._combiner, self._is_main = checkpoint_format, combiner, is_main
        self._nonfinite = nonfinite
        self.monitor = runs.policy.monitor if runs is not None else None  # trainer.log() hands its values here
        self._monitor_step, self._monitor_value = -1, None  # the first value of monitor logged at that step
        self._monitor_seen = self._monitor_warned = self._saved_in_run = False
        self.registered: dict[str, Any] = state.registered  # the state's own: its loads check them first
        self.resumed = False

    # ---- what rides along ----------------------------------------------------------------------------
    def register(self, **objects: Any) -> None:
        """Keep ``objects`` (each with ``state_dict``/``load_state_dict``, or a tensor) in every checkpoint."""
        for name, obj in objects.items():
            stateful = callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))
            if not (stateful or isinstance(obj, torch.Tensor)):
                raise ConfigError(f"cannot checkpoint {name}={type(obj).__name__}: register an object with "
                                  "state_dict() and load_state_dict(), or a tensor")
            self.registered[name] = obj

    def _restore_registered(self, path: Path, extra: dict[str, Any], restored_by: str) -> None:
        # for a format whose load did not restore them with the rest: what it restored cannot be put back from here
        from devplug.core.checkpoint.rollback import all_or_nothing, restore_registered

        with all_or_nothing(path) as rollback:
            rollback.exposed = f"what the {restored_by} format restored"
            restore_registered(self.registered, extra, rollback)

    @property
    def writer(self) -> CheckpointFormat:
        """The format that writes this run's checkpoints (``writer.wait()`` waits for a background save)."""
        return self.format

    # ---- save and load -------------------------------------------------------------------------------
    def save(self, path: str | os.PathLike[str], extra: dict[str, Any], *, async_save: bool = False) -> str | None:
        """Write a checkpoint with the registered objects and ``extra``; the path, or ``None`` on other ranks."""
        from devplug.core.optim.build import optimizers_not_saved

        for described in optimizers_not_saved(self._stepped, self.state.optimizers, self.registered.values(),
                                              self.state.modules):
            warnings.warn(f"optimizer {described} is not in the checkpoint: it was passed to trainer.step() but "
                          "not built by trainer.optimizer(), so a resume starts it afresh. Build it with "
                          "trainer.optimizer(...), or trainer.register_for_checkpointing(name=optimizer)",
                          RuntimeWarning, stacklevel=3)
        clashes = sorted(set(extra) & set(self.registered))
        if clashes:  # the extra would silently stand in for that object's state, and a load would feed it to it
            raise ConfigError(f"save() extra {clashes[0]!r} has the name of an object registered for checkpointing, "
                              "whose state is saved under it; give the extra another name")
        if self.registered:
            own = {name: obj if isinstance(obj, torch.Tensor) else obj.state_dict()
                   for name, obj in self.registered.items()}
            extra = {**own, **extra}
        return self.format.save(self.state, Path(path), extra, main=self._is_main, async_save=async_save)

    def load(self, path: str | os.PathLike[str]) -> dict[str, Any]:
        """Restore a checkpoint of any registered format and the registered objects; its ``extra``."""
        from devplug.core.checkpoint.format import format_of

        self.format.wait()
        self.state.registered_restored = False
        checkpoint_format = format_of(path, self.format)
        extra = checkpoint_format.load(self.state, Path(path))
        if not self.state.registered_restored:
            self._restore_registered(Path(path), extra, checkpoint_format.name)
        return extra

    # ---- resume --------------------------------------------------------------------------------------
    def resume(self, path: str | os.PathLike[str] | None) -> Resumed | None:
        """Continue from ``path`` or the policy's newest intact checkpoint; ``None`` when there is none."""
        from devplug.core.checkpoint.resume import Resumed

        runs = self.runs
        if path is None and runs is None:
            raise ConfigError("resume() needs a checkpoint policy (Trainer(checkpoints=devplug.CheckpointPolicy("
                              "directory=...))) or the checkpoint to resume from: resume(path)")
        self.resumed = True
        source = Path(path) if path is not None else runs.folder  # type: ignore[union-attr]
        if self.format.collective and self._combiner is not None:
            report, extra = self._choose_together(source, explicit=path is not None)
        else:
            report, extra = self._choose_and_load(source, explicit=path is not None)
        if report is None:
            return None
        chosen = Path(report["path"])
        position = self.state.position
        if runs is not None:
            runs.resumed_from(chosen, position.global_step)
        log.info("resumed from %s (step %d)", chosen, position.global_step)
        return Resumed(path=chosen, step=position.global_step, epoch=position.epoch, extra=extra,
                       skipped=tuple((Path(p), why) for p, why in report["skipped"]),
                       set_aside=Path(report["set_aside"]) if report["set_aside"] else None,
                       set_aside_count=report["set_aside_count"])

    def _choose_and_load(self, source: Path, *, explicit: bool) -> tuple[dict[str, Any] | None, dict[str, Any]]:
        # rank 0 tries the candidates (loading each, skipping damaged ones); the other ranks load its choice,
        # or raise its error with it (none is left waiting for a choice that never comes)
        from devplug.core.checkpoint import resume as resume_files

        report: dict[str, Any] | None = None
        extra: dict[str, Any] = {}
        failed: Exception | None = None
        if self._is_main:
            try:
                choice = resume_files.choose(source, self.load, explicit=explicit)
                if choice is not None:
                    extra = choice.extra
                    report = _resume_report(choice.path, choice.skipped, self._own_folder())
            except Exception as exc:
                if self._combiner is None:
                    raise
                failed = exc
        if self._combiner is not None:
            report, problem = self._from_rank0((report, _as_problem(failed)))
            if failed is not None:
                raise failed
            if problem is not None:
                kind, text = problem
                raise kind(text) if isinstance(kind, type) and issubclass(kind, DevplugError) else \
                    CheckpointError(f"rank 0 could not resume: {text}")
            if report is not None:
                if not self._is_main:
                    try:
                        extra = self.load(report["path"])
                    except Exception as exc:
                        failed = exc
                self._every_rank_loaded(report["path"], failed)
        return report, extra

    def _every_rank_loaded(self, path: str, failed: Exception | None) -> None:
        """Raise on every rank when a rank could not load rank 0's choice (its file is not on that node's disk,
        say): the others would otherwise go on to wait for it at the first collective."""
        import torch.distributed as dist

        assert self._combiner is not None
        found: list[Any] = [None] * dist.get_world_size(self._combiner.group)
        dist.all_gather_object(found, _as_problem(failed), group=self._combiner.group)
        if failed is not None:
            raise failed
        for rank, problem in enumerate(found):
            if problem is not None:
                raise CheckpointError(f"rank {rank} could not load {path}: {problem[1]}")

    def _choose_together(self, source: Path, *, explicit: bool) -> tuple[dict[str, Any] | None, dict[str, Any]]:
        # Loading a collective format's checkpoint (a sharded folder) is a collective: rank 0 names the newest
        # complete one (a save is renamed into place only once every rank has written), and every rank loads it.
        from devplug.core.checkpoint import resume as resume_files

        named: tuple[str | None, str] = (None, "")
        skipped: tuple[tuple[Path, str], ...] = ()
        if self._is_main:  # the newest whose files are intact (its manifest checked), damaged ones passed over
            newest, skipped, problem = resume_files.newest_intact(source, explicit=explicit)
            named = (str(newest) if newest else None, problem)
        chosen, problem = self._from_rank0(named)
        if problem:
            raise CheckpointError(problem)
        if chosen is None:
            return None, {}
        extra = self.load(chosen)
        report = _resume_report(Path(chosen), skipped, self._own_folder()) if self._is_main else None
        return self._from_rank0(report), extra

    def _own_folder(self) -> Path | None:
        """The folder this run's policy saves into (``None`` without a policy)."""
        return self.runs.folder if self.runs is not None else None

    def _from_rank0(self, value: Any) -> Any:
        return self._combiner.broadcast(value, source=0) if self._combiner is not None else value

    # ---- the policy's saves --------------------------------------------------------------------------
    def save_if_due(self) -> str | None:
        """Between steps: save when the policy says one is due (the ranks agree on a sharded clock save)."""
        runs = self.runs
        if runs is None:
            return None
        due = runs.policy.due(self.state.position.global_step, runs.last_saved_step, runs.last_saved_time,
                              time.monotonic())
        if self.format.collective and self._combiner is not None and runs.policy.every_minutes is not None:
            due = bool(self._combiner.max(int(due)))  # a collective save is collective: the ranks' clocks agree
        return self.save_by_policy() if due else None

    def save_by_policy(self) -> str | None:
        """Save this step's checkpoint by the policy (named, pruned, checked); the path, else ``None``."""
        runs = self.runs
        if runs is None:
            raise ConfigError("checkpoint_now() needs a checkpoint policy: Trainer(checkpoints="
                              "devplug.CheckpointPolicy(directory=...))")
        step = self.state.position.global_step
        if step <= runs.last_saved_step or step == 0:
            return None
        if not self._is_main and not self.format.collective:  # a collective save: every rank writes its part
            runs.last_saved_step, runs.last_saved_time = step, time.monotonic()
            return None
        score = self._score(step)
        if score is None and self._saved_in_run:
            self.warn_unseen_monitor()  # a second save of this run and still no value: a misspelt monitor, say
        self._saved_in_run = True
        written: list[float] = []  # when the write ended: the index and pruning follow it

        def write(path: Path) -> Any:
            try:
                return self._policy_save(path)
            finally:
                written.append(time.perf_counter())

        try:
            return str(runs.save(step, write, score, main=self._is_main))
        except NonFiniteLossError as exc:
            if self._nonfinite == "raise":
                raise
            # counted as done for the clocks: a diverged run is not re-checked at every step boundary
            runs.last_saved_step, runs.last_saved_time = step, time.monotonic()
            log.warning("%s (training goes on: nonfinite=%r)", exc, self._nonfinite)
            return None
        finally:
            if written:
                self._bookkeeping(time.perf_counter() - written[0])

    # ---- the monitored value: each checkpoint scored with its own weights' value -------------------------
    def monitor_logged(self, step: int, value: Any) -> None:
        """``trainer.log`` got the policy's monitor at ``step``: the first such value scores that step's checkpoint.

        A checkpoint saved at this step before the value arrived (the policy saves when the training loader
        is exhausted, before the evaluation that follows) takes it now: ``checkpoints.json`` is rewritten and
        the folder pruned again.
        """
        if step == self._monitor_step:
            return
        self._monitor_step, self._monitor_value, self._monitor_seen = step, value, True
        runs = self.runs
        if runs is not None and runs.awaiting == step and self._is_main:
            score = self._score(step)
            if score is not None:
                began = time.perf_counter()
                runs.attach(step, score)  # the index rewritten and the folder pruned again
                self._bookkeeping(time.perf_counter() - began)

    def _score(self, step: int) -> float | None:
        if self._monitor_step != step or self._monitor_value is None:
            return None
        value = self._monitor_value
        return float(value.item()) if isinstance(value, torch.Tensor) else float(value)

    def warn_unseen_monitor(self) -> None:
        """One warning when the policy's monitor was never logged (no checkpoint can be scored), else nothing.

        Nothing either when this process saved nothing and a checkpoint in the folder has a score: a run resumed
        with nothing left to train logs no value, and its checkpoints were scored when they were written.
        """
        if self.monitor is None or self._monitor_seen or self._monitor_warned or not self._is_main:
            return
        runs = self.runs
        if runs is not None and not self._saved_in_run and runs.has_scores():
            return
        self._monitor_warned = True
        keeps = " only the newest checkpoints are kept" if runs is not None and runs.policy.keep_best else ""
        warnings.warn(f"the checkpoint policy's monitor {self.monitor!r} was never logged, so no checkpoint has a "
                      f"score;{keeps}. Log it after each evaluation (trainer.log({self.monitor}=...)) or fix "
                      "monitor= to a name you log", RuntimeWarning, stacklevel=2)


def _as_problem(exc: Exception | None) -> tuple[type, str] | None:
    """``exc`` as values another rank can get and raise: its class and its message (``None`` for none)."""
    if exc is None:
        return None
    return type(exc), str(exc) if isinstance(exc, DevplugError) else f"{type(exc).__name__}: {exc}"


def _resume_report(path: Path, skipped: Any, own_folder: Path | None) -> dict[str, Any]:
    """Rank 0's account of a resume, as plain values every rank can get.

    Only in ``own_folder``, the folder this run's policy saves into, are the checkpoints newer than ``path``
    set aside (there they would be pruned or resumed by mistake) and the temporary files of killed saves
    removed. Another run's folder, or any folder without a policy, is only read: that run may still be
    writing it, and its own resume must find its checkpoints where it left them.
    """
    from devplug.core.checkpoint.policy import set_aside_newer
    from devplug.core.checkpoint.tempfiles import remove_stale_temp_files

    aside, moved = None, 0
    if own_folder is not None and _same_folder(path.parent, own_folder):
        aside, moved = set_aside_newer(path)
        remove_stale_temp_files(path.parent)  # what saves killed before this resume left
    return {"path": str(path), "skipped": [(str(p), why) for p, why in skipped],
            "set_aside": str(aside) if aside is not None else None, "set_aside_count": moved}


def _same_folder(a: Path, b: Path) -> bool:
    """Whether ``a`` and ``b`` name the same folder (through links and relative paths alike)."""
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return a.absolute() == b.absolute()
