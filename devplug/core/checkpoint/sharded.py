"""Sharded checkpoints: a ``torch.distributed.checkpoint`` (DCP) folder every rank writes its shards into.

A save writes into ``.<name>.<host>.<pid>.partial`` beside the target (named after the job's rank 0, so two
jobs never share one); rank 0 writes the small state file (``trainer.pt``: loop position, RNG, scaler, the
author's extra state), every rank its shards (DCP writes its ``.metadata`` last, after gathering every
rank's results), then rank 0 lists every file with its digest in ``manifest.json`` and renames the folder
into place, the previous checkpoint of that name moved aside first and removed after (put back if the
rename fails). A save killed midway
leaves a ``.partial`` folder that is never taken for a checkpoint and is removed once its writer is gone by
the next save or the checkpoint policy's tidying (`remove_stale_temp_files`). DCP reshards on load, so a
folder written by N ranks loads on any number of ranks, or into one process.

A load checks the manifest first (a damaged, missing, added or swapped file is one "damaged" line), then
reads the metadata and the state as data only (`devplug.core.checkpoint.safe_dcp`): nothing in a
checkpoint is ever run.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from devplug.core.checkpoint import file as ckpt
from devplug.core.checkpoint.diskfull import disk_full_cause, disk_full_line
from devplug.core.checkpoint.manifest import MANIFEST_FILE, check_manifest, write_manifest
from devplug.core.checkpoint.tempfiles import host_tag, remove_stale_temp_files, tag_writer
from devplug.core.errors import CheckpointError, CheckpointMismatchError

log = logging.getLogger("devplug")

#: The small file rank 0 writes into a sharded checkpoint folder: everything but the sharded tensors.
STATE_FILE = "trainer.pt"
#: The file DCP writes last into a complete checkpoint folder.
DCP_METADATA = ".metadata"


def is_sharded_checkpoint(path: str | os.PathLike[str]) -> bool:
    """True for a folder holding a complete sharded checkpoint (DCP metadata and the state file)."""
    folder = Path(path)
    return folder.is_dir() and (folder / DCP_METADATA).is_file() and (folder / STATE_FILE).is_file()


def partial_path(path: str | os.PathLike[str], writer: str | None = None) -> Path:
    """Where a save of ``path`` by ``writer`` (``"<host>.<pid>"`` of its rank 0; this process when left out)
    writes before it is complete."""
    target = Path(path)
    return target.parent / f".{target.name}.{writer or f'{host_tag()}.{os.getpid()}'}.partial"


def _job_staging(target: Path) -> Path:
    """This job's staging folder for ``target``: rank 0's name, the same on every rank."""
    name = [str(partial_path(target))]
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast_object_list(name, src=0)
    return Path(name[0])


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def _replace(staging: Path, target: Path) -> None:
    """Rename the complete ``staging`` folder to ``target``; a previous ``target`` is moved aside, then removed.

    When the rename into place fails, the previous checkpoint is put back. One left aside by a save killed
    between the two renames (no ``target`` beside it) is put back first, not deleted.
    """
    aside = target.parent / f".{target.name}.old"
    if not target.exists() and is_sharded_checkpoint(aside):
        os.replace(aside, target)
    shutil.rmtree(aside, ignore_errors=True)
    if target.exists():
        os.replace(target, aside)
    try:
        os.replace(staging, target)
    except BaseException:
        if aside.exists() and not target.exists():
            os.replace(aside, target)
        raise
    shutil.rmtree(aside, ignore_errors=True)


def _failure(exc: BaseException, target: Path, *, asynchronous: bool = False) -> Exception:
    """What a failed save raises, on every rank alike.

    A full disk is an ``OSError`` (ENOSPC/EDQUOT) naming ``target`` for a synchronous save, which the
    checkpoint policy words as its one line naming the previous checkpoint; anything else, and an
    asynchronous save (reported later, by the next save or ``close()``), a one-line `CheckpointError`.
    """
    full = disk_full_cause(exc)
    if full is not None and not asynchronous:
        return OSError(full.errno, full.strerror, str(target))
    if full is not None:
        return CheckpointError(f"{disk_full_line(repr(str(target)), full)} in the background; the earlier "
                               "checkpoints are intact; free some space or save the checkpoints on "
                               "another disk")
    failures = getattr(exc, "failures", None)
    causes = [v[0] if isinstance(v, tuple) else v for v in failures.values()] if isinstance(failures, dict) else []
    cause = causes[0] if causes else exc
    reason = ckpt.one_line(str(cause), 300) or type(cause).__name__
    kind = "asynchronous save" if asynchronous else "save"
    return CheckpointError(f"the {kind} of {str(target)!r} failed, and the previous checkpoint of that name was "
                           f"kept: {reason}")


def _agree(failure: Exception | None) -> Exception | None:
    """Rank 0's failure (or ``None``) on every rank: a step only rank 0 takes fails on all or none."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        box = [failure]
        dist.broadcast_object_list(box, src=0)
        return box[0]
    return failure


class ShardedWriter:
    """Writes sharded checkpoints, one at a time: a pending asynchronous save is finished before the next."""

    def __init__(self) -> None:
        self._pending: tuple[Any, threading.Event, list[BaseException], Path, Path] | None = None
        self._async_group: Any = None

    def save(self, path: str | os.PathLike[str], tensors: Mapping[str, Any], state: Mapping[str, Any], *,
             async_save: bool = False) -> Path:
        """Write ``tensors`` (every rank its shards) and rank 0's ``state`` into the checkpoint folder ``path``.

        A collective: every rank calls it. Synchronous saves return once the folder is in place on every
        rank; with ``async_save`` the tensors are copied to host memory, written in the background, and
        the folder is renamed into place when they are (`wait` finishes it). A save that fails (a full
        disk included) raises the same one-line error on every rank, removes what it wrote and leaves the
        previous checkpoint of that name as it was.
        """
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.api import CheckpointException

        self.wait()
        target = Path(path)
        staging = _job_staging(target)
        failure: Exception | None = None
        if _rank() == 0:
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.rmtree(staging, ignore_errors=True)  # a save of this process that was killed midway
                remove_stale_temp_files(target.parent)  # and those of processes that are gone
                staging.mkdir()
                tag_writer(staging)
                ckpt.atomic_save(ckpt.with_digest(ckpt.to_cpu(dict(state))), staging / STATE_FILE)
            except Exception as exc:  # a full disk before the shards: nothing of this save is left
                shutil.rmtree(staging, ignore_errors=True)
                failure = _failure(exc, target, asynchronous=async_save)
        failure = _agree(failure)  # also the barrier: the staging folder exists before any rank writes
        if failure is not None:
            raise failure
        if not async_save:
            try:
                dcp.save(dict(tensors), checkpoint_id=str(staging))
            except (Exception, CheckpointException) as exc:  # DCP raises on every rank alike
                _barrier()
                if _rank() == 0:
                    shutil.rmtree(staging, ignore_errors=True)
                raise _failure(exc, target) from None
            if _rank() == 0:
                try:
                    write_manifest(staging)
                    _replace(staging, target)
                except Exception as exc:
                    shutil.rmtree(staging, ignore_errors=True)
                    failure = _failure(exc, target)
            failure = _agree(failure)
            if failure is not None:
                raise failure
            return target
        if self._async_group is None and dist.is_initialized():
            # its own group, so the background writer's collectives never interleave with training's
            self._async_group = dist.new_group(backend="gloo")
        try:
            future: Any = dcp.async_save(dict(tensors), checkpoint_id=str(staging),
                                         process_group=self._async_group)
        except (Exception, CheckpointException) as exc:
            if _rank() == 0:
                shutil.rmtree(staging, ignore_errors=True)
            raise _failure(exc, target, asynchronous=True) from None
        done, errors = threading.Event(), []

        def finish(fut: Any) -> None:
            try:
                fut.result()
                if _rank() == 0:
                    write_manifest(staging)
                    _replace(staging, target)
            except BaseException as exc:  # reported by wait()
                errors.append(exc)
            finally:
                done.set()

        future.add_done_callback(finish)
        self._pending = (future, done, errors, target, staging)
        return target

    def wait(self) -> None:
        """Finish the pending asynchronous save, if any; raise a one-line `CheckpointError` if it failed."""
        if self._pending is None:
            return
        _future, done, errors, target, staging = self._pending
        self._pending = None
        done.wait()
        if errors:
            if _rank() == 0:
                shutil.rmtree(staging, ignore_errors=True)
            raise _failure(errors[0], target, asynchronous=True) from None
        log.info("asynchronous checkpoint %s written", target)


def load_tensors(path: str | os.PathLike[str], tensors: dict[str, Any], *, live: bool = False) -> None:
    """Read a sharded checkpoint's tensors into ``tensors`` in place (DCP reshards to this run's layout).

    ``live``: ``tensors`` are the run's own (its weights, its optimizers' states), so a read that fails
    after it began copying into them says they may hold part of the checkpoint; a failure before (a key or
    shape of another setup) changed nothing either way.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    from devplug.core.checkpoint import safe_dcp

    planner = safe_dcp.SafeLoadPlanner()
    try:
        with warnings.catch_warnings():
            # Reading without a process group is a documented use (a sharded checkpoint resumed on one process
            # without sharding); DCP warns that it "assumes" exactly that.
            warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized",
                                    category=UserWarning)
            dcp.load(tensors, storage_reader=safe_dcp.SafeReader(str(path)), planner=planner)
    except (Exception, CheckpointException) as exc:  # a missing or mismatched entry (DCP's is a BaseException)
        # DCP's exception holds each failed rank's (exception, trace): its own words, without the traces
        failures = [failure[0] for failure in exc.failures.values()] if isinstance(exc, CheckpointException) else []
        cause = failures[0] if failures else exc
        ours = next((f for f in [exc, *failures] if isinstance(f, CheckpointError)), None)
        reason = ckpt.one_line(str(ours if ours is not None else cause), 300) or type(cause).__name__
        if live and planner.wrote:  # damaged or unreadable half-way: another checkpoint loads over all of it
            raise CheckpointError(f"sharded checkpoint {str(path)!r} could not be read ({reason}) after part of it "
                                  "was copied into this run's weights and optimizer states: load an intact "
                                  "checkpoint before training on") from exc
        if ours is not None:  # the checkpoint refused as it was read (not data only, damaged)
            raise CheckpointError(ckpt.one_line(str(ours))) from exc
        # a key or shape of this run's the checkpoint lacks: a checkpoint of another setup, not a damaged one
        kind = CheckpointError if isinstance(cause, OSError) else CheckpointMismatchError
        raise kind(f"sharded checkpoint {str(path)!r} does not fit this run, and nothing was "
                   f"restored: {reason}") from exc


def read_state(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The state file of a sharded checkpoint (position, RNG, scaler, extra), checked like a checkpoint file."""
    folder = Path(path)
    if not is_sharded_checkpoint(folder):
        raise CheckpointError(f"checkpoint {str(folder)!r} is a folder but not a complete sharded checkpoint "
                              f"(it lacks {DCP_METADATA} or {STATE_FILE}: a save that did not finish?)")
    check_sharded(folder)
    return ckpt.read_checkpoint(folder / STATE_FILE)


def check_sharded(path: str | os.PathLike[str]) -> None:
    """Raise a one-line `CheckpointError` unless the sharded checkpoint ``path`` is intact and plain data.

    Every file must match the folder's manifest (else it is "damaged"), and the DCP metadata must hold
    only DCP's records (else it is refused, and nothing in it has run).
    """
    from devplug.core.checkpoint import safe_dcp  # imports DCP: only when a sharded checkpoint is read

    check_manifest(path)
    safe_dcp.read_metadata(path)


def consolidate_checkpoint(src: str | os.PathLike[str], dst: str | os.PathLike[str], module: str | None = None) -> Path:
    """Write one module's full weights from sharded checkpoint ``src`` into the file ``dst``.

    The file holds a plain ``state_dict`` (parameter names to CPU tensors) that ``torch.load(dst,
    weights_only=True)`` reads and ``module.load_state_dict`` accepts. ``module`` names the set-up module
    (``Trainer.setup(..., name=)``); it may be left out when the checkpoint holds only one. Runs in one
    process, without a process group. ``dst`` may not be inside ``src`` (a file added to a sharded checkpoint
    makes it read as damaged).
    """
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    from devplug.core.checkpoint import safe_dcp

    if Path(dst).resolve().is_relative_to(Path(src).resolve()):
        raise CheckpointError(f"{str(dst)!r} is inside the checkpoint {str(src)!r}, whose files are listed in its "
                              f"{MANIFEST_FILE}; write the weights outside it")
    state = read_state(src)
    names = list(state.get("sharded_modules", []))
    if module is None:
        if len(names) != 1:
            raise CheckpointError(f"checkpoint {str(src)!r} holds modules {names}: name the one to consolidate")
        module = names[0]
    if module not in names:
        raise CheckpointError(f"checkpoint {str(src)!r} holds no module {module!r} (it holds {names})")
    loaded: dict[str, Any] = {}
    _load_state_dict(loaded, storage_reader=safe_dcp.SafeReader(str(src)),
                     planner=safe_dcp.SafeEmptyLoadPlanner(keys={"modules"}), no_dist=True)
    weights = {k: v.detach().cpu().contiguous() for k, v in loaded["modules"][module].items()
               if isinstance(v, torch.Tensor)}
    return ckpt.atomic_save(weights, dst)
