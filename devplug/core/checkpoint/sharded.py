"""Sharded checkpoints: a ``torch.distributed.checkpoint`` (DCP) folder every rank writes its shards into.

A save writes into ``.<name>.partial`` beside the target; once every rank's shards are written (DCP writes
its ``.metadata`` last, after gathering every rank's results), rank 0 adds the small state file
(``trainer.pt``: loop position, RNG, scaler, the author's extra state) and renames the folder into place,
the previous checkpoint of that name moved aside first and removed after. A save killed midway leaves a
``.partial`` folder that is never taken for a checkpoint and is removed by the next save of that name, or
once its writer is gone by the checkpoint policy's tidying (`remove_stale_temp_files`). DCP reshards on
load, so a folder written by N ranks loads on any number of ranks, or into one process.
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
from devplug.core.checkpoint.tempfiles import tag_writer
from devplug.core.errors import CheckpointError

log = logging.getLogger("devplug")

#: The small file rank 0 writes into a sharded checkpoint folder: everything but the sharded tensors.
STATE_FILE = "trainer.pt"
#: The file DCP writes last into a complete checkpoint folder.
DCP_METADATA = ".metadata"


def is_sharded_checkpoint(path: str | os.PathLike[str]) -> bool:
    """True for a folder holding a complete sharded checkpoint (DCP metadata and the state file)."""
    folder = Path(path)
    return folder.is_dir() and (folder / DCP_METADATA).is_file() and (folder / STATE_FILE).is_file()


def partial_path(path: str | os.PathLike[str]) -> Path:
    """Where a save of ``path`` writes before it is complete (the same name on every rank)."""
    target = Path(path)
    return target.parent / f".{target.name}.partial"


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def _replace(staging: Path, target: Path) -> None:
    """Rename the complete ``staging`` folder to ``target``; a previous ``target`` is moved aside, then removed."""
    aside = target.parent / f".{target.name}.old"
    shutil.rmtree(aside, ignore_errors=True)
    if target.exists():
        os.replace(target, aside)
    os.replace(staging, target)
    shutil.rmtree(aside, ignore_errors=True)


class ShardedWriter:
    """Writes sharded checkpoints, one at a time: a pending asynchronous save is finished before the next."""

    def __init__(self) -> None:
        self._pending: tuple[Any, threading.Event, list[BaseException], Path] | None = None
        self._async_group: Any = None

    def save(self, path: str | os.PathLike[str], tensors: Mapping[str, Any], state: Mapping[str, Any], *,
             async_save: bool = False) -> Path:
        """Write ``tensors`` (every rank its shards) and rank 0's ``state`` into the checkpoint folder ``path``.

        A collective: every rank calls it. Synchronous saves return once the folder is in place on every
        rank; with ``async_save`` the tensors are copied to host memory, written in the background, and
        the folder is renamed into place when they are (`wait` finishes it).
        """
        import torch.distributed.checkpoint as dcp

        self.wait()
        target = Path(path)
        staging = partial_path(target)
        if _rank() == 0:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(staging, ignore_errors=True)  # a save that was killed midway
            staging.mkdir()
            tag_writer(staging)
            ckpt.atomic_save(ckpt.with_digest(ckpt.to_cpu(dict(state))), staging / STATE_FILE)
        _barrier()
        if not async_save:
            dcp.save(dict(tensors), checkpoint_id=str(staging))
            if _rank() == 0:
                _replace(staging, target)
            _barrier()
            return target
        if self._async_group is None and dist.is_initialized():
            # its own group, so the background writer's collectives never interleave with training's
            self._async_group = dist.new_group(backend="gloo")
        future: Any = dcp.async_save(dict(tensors), checkpoint_id=str(staging), process_group=self._async_group)
        done, errors = threading.Event(), []

        def finish(fut: Any) -> None:
            try:
                fut.result()
                if _rank() == 0:
                    _replace(staging, target)
            except BaseException as exc:  # reported by wait()
                errors.append(exc)
            finally:
                done.set()

        future.add_done_callback(finish)
        self._pending = (future, done, errors, target)
        return target

    def wait(self) -> None:
        """Finish the pending asynchronous save, if any; raise `CheckpointError` if it failed."""
        if self._pending is None:
            return
        _future, done, errors, target = self._pending
        self._pending = None
        done.wait()
        if errors:
            raise CheckpointError(f"the asynchronous save of {str(target)!r} failed, and the previous checkpoint "
                                  f"of that name was kept: {errors[0]}") from errors[0]
        log.info("asynchronous checkpoint %s written", target)


def load_tensors(path: str | os.PathLike[str], tensors: dict[str, Any]) -> None:
    """Read a sharded checkpoint's tensors into ``tensors`` in place (DCP reshards to this run's layout)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        with warnings.catch_warnings():
            # Reading without a process group is a documented use (a sharded checkpoint resumed on one process
            # without sharding); DCP warns that it "assumes" exactly that.
            warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized",
                                    category=UserWarning)
            dcp.load(tensors, checkpoint_id=str(path))
    except (Exception, CheckpointException) as exc:  # a missing or mismatched entry (DCP's is a BaseException)
        # DCP's exception holds each failed rank's (exception, trace): its own words, without the traces
        failures = [failure[0] for failure in exc.failures.values()] if isinstance(exc, CheckpointException) else []
        cause = failures[0] if failures else exc
        reason = " ".join(str(cause).split())[:300] or type(cause).__name__
        raise CheckpointError(f"sharded checkpoint {str(path)!r} does not fit this run, and nothing was "
                              f"restored: {reason}") from exc


def read_state(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The state file of a sharded checkpoint (position, RNG, scaler, extra), checked like a checkpoint file."""
    folder = Path(path)
    if not is_sharded_checkpoint(folder):
        raise CheckpointError(f"checkpoint {str(folder)!r} is a folder but not a complete sharded checkpoint "
                              f"(it lacks {DCP_METADATA} or {STATE_FILE}: a save that did not finish?)")
    return ckpt.read_checkpoint(folder / STATE_FILE)


def consolidate_checkpoint(src: str | os.PathLike[str], dst: str | os.PathLike[str], module: str | None = None) -> Path:
    """Write one module's full weights from sharded checkpoint ``src`` into the file ``dst``.

    The file holds a plain ``state_dict`` (parameter names to CPU tensors) that ``torch.load(dst,
    weights_only=True)`` reads and ``module.load_state_dict`` accepts. ``module`` names the set-up module
    (``Trainer.setup(..., name=)``); it may be left out when the checkpoint holds only one. Runs in one
    process, without a process group.
    """
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    state = read_state(src)
    names = list(state.get("sharded_modules", []))
    if module is None:
        if len(names) != 1:
            raise CheckpointError(f"checkpoint {str(src)!r} holds modules {names}: name the one to consolidate")
        module = names[0]
    if module not in names:
        raise CheckpointError(f"checkpoint {str(src)!r} holds no module {module!r} (it holds {names})")
    loaded: dict[str, Any] = {}
    _load_state_dict(loaded, storage_reader=FileSystemReader(str(src)),
                     planner=_EmptyStateDictLoadPlanner(keys={"modules"}), no_dist=True)
    weights = {k: v.detach().cpu().contiguous() for k, v in loaded["modules"][module].items()
               if isinstance(v, torch.Tensor)}
    return ckpt.atomic_save(weights, dst)
