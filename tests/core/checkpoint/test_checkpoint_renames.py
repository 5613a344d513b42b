"""Renames that must never lose a checkpoint: the folders newer checkpoints are set aside into are never
reused, and a sharded save whose final rename fails puts the previous checkpoint of that name back."""

from __future__ import annotations

import datetime
import errno
import os
from pathlib import Path

import pytest
import torch

from devplug.core.checkpoint import sharded
from devplug.core.checkpoint.policy import set_aside_newer
from devplug.core.errors import CheckpointError


# ---- set-aside folders ---------------------------------------------------------------------------------------
def test_two_set_asides_in_the_same_second_keep_both_files(tmp_path):
    now = datetime.datetime(2026, 1, 2, 3, 4, 5)
    (tmp_path / "step_0000001.pt").write_bytes(b"resumed")
    folders = []
    for attempt in (b"first run", b"second run"):  # a resume, then another within the same second
        (tmp_path / "step_0000002.pt").write_bytes(attempt)
        aside, moved = set_aside_newer(tmp_path / "step_0000001.pt", now=now)
        assert moved == 1 and aside is not None and aside.parent == tmp_path
        assert aside.name.startswith("abandoned-20260102-030405")
        folders.append(aside)
    assert folders[0] != folders[1]  # a new folder each time, never an existing one
    assert [(f / "step_0000002.pt").read_bytes() for f in folders] == [b"first run", b"second run"]


def test_a_set_aside_never_moves_into_a_folder_that_is_there(tmp_path):
    now = datetime.datetime(2026, 1, 2, 3, 4, 5)
    taken = tmp_path / "abandoned-20260102-030405"
    taken.mkdir()
    (taken / "step_0000002.pt").write_bytes(b"set aside earlier")
    (tmp_path / "step_0000001.pt").write_bytes(b"resumed")
    (tmp_path / "step_0000002.pt").write_bytes(b"newer")
    aside, _moved = set_aside_newer(tmp_path / "step_0000001.pt", now=now)
    assert aside is not None and aside != taken
    assert (taken / "step_0000002.pt").read_bytes() == b"set aside earlier"
    assert (aside / "step_0000002.pt").read_bytes() == b"newer"


# ---- the final rename of a sharded save ----------------------------------------------------------------------
def _save(writer: sharded.ShardedWriter, path: Path, value: float) -> None:
    writer.save(path, {"w": torch.full((4,), value)}, {"value": value})


def _state(path: Path) -> float:
    return torch.load(path / sharded.STATE_FILE, weights_only=True)["value"]


def _weights(path: Path) -> torch.Tensor:
    tensors = {"w": torch.zeros(4)}
    sharded.load_tensors(path, tensors)
    return tensors["w"]


@pytest.mark.parametrize("asynchronous", [False, True])
def test_a_failed_final_rename_puts_the_previous_checkpoint_back(tmp_path, monkeypatch, asynchronous):
    target = tmp_path / "latest.pt"
    writer = sharded.ShardedWriter()
    _save(writer, target, 1.0)
    real = os.replace

    def replace(src, dst, *args, **kwargs):
        if Path(src).name.endswith(".partial"):  # the complete new folder cannot be renamed into place
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(CheckpointError) as info:
        writer.save(target, {"w": torch.full((4,), 2.0)}, {"value": 2.0}, async_save=asynchronous)
        writer.wait()
    monkeypatch.undo()
    assert "\n" not in str(info.value) and "the previous checkpoint of that name was kept" in str(info.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest.pt"]  # back in place, nothing else left
    sharded.check_sharded(target)  # whole: every file matches its manifest
    assert _state(target) == 1.0 and torch.equal(_weights(target), torch.full((4,), 1.0))
    _save(writer, target, 3.0)  # and the next save of that name replaces it as usual
    assert torch.equal(_weights(target), torch.full((4,), 3.0))


def test_a_previous_checkpoint_left_aside_by_a_killed_rename_is_put_back_not_deleted(tmp_path, monkeypatch):
    target = tmp_path / "latest.pt"
    writer = sharded.ShardedWriter()
    _save(writer, target, 1.0)
    os.replace(target, tmp_path / ".latest.pt.old")  # a save killed between its two renames
    real = os.replace

    def replace(src, dst, *args, **kwargs):
        if Path(src).name.endswith(".partial"):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(CheckpointError):
        _save(writer, target, 2.0)  # the next save of that name, failing at the same point
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest.pt"]
    sharded.check_sharded(target)
    assert _state(target) == 1.0
