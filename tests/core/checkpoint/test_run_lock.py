"""The run lock: a second job on a checkpoint folder is refused in one line naming the holder, a dead
holder's lock is taken over, Trainers of one process share it, and both examples are refused the same way."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import devplug
from devplug.core.checkpoint import runlock
from devplug.core.errors import CheckpointError

_HOLD = """
import sys
from devplug.core.checkpoint import runlock
runlock.acquire(sys.argv[1])
print("held", flush=True)
sys.stdin.read()
"""


@contextlib.contextmanager
def _held(folder: Path) -> Iterator[subprocess.Popen]:
    """Another process holding the run lock of ``folder`` until the block ends (or the test kills it)."""
    proc = subprocess.Popen([sys.executable, "-c", _HOLD, str(folder)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        yield proc
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture
def holder(tmp_path):
    """Another process holding the run lock of ``tmp_path / "ckpt"``."""
    with _held(tmp_path / "ckpt") as proc:
        yield proc


def _trainer(folder: Path) -> devplug.Trainer:
    return devplug.Trainer(device="cpu", precision="32-true", progress=False,
                           checkpoints=devplug.CheckpointPolicy(directory=folder))


def test_a_second_job_is_refused_in_one_line_naming_the_holder(tmp_path, holder):
    with pytest.raises(CheckpointError) as info:
        _trainer(tmp_path / "ckpt")
    message = str(info.value)
    assert f"pid {holder.pid}" in message and "host " in message and "started " in message
    assert "another run is writing" in message and "\n" not in message
    assert list((tmp_path / "ckpt").iterdir()) == []  # nothing written by the refused job


def test_the_lock_of_a_killed_run_is_taken_over(tmp_path, holder, caplog):
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    with caplog.at_level(logging.INFO, logger="devplug"):
        trainer = _trainer(tmp_path / "ckpt")
    assert f"pid {holder.pid}" in caplog.text and "took over" in caplog.text
    assert runlock.read_holder(tmp_path / "ckpt")["pid"] == os.getpid()
    trainer.close()


def test_a_lock_record_naming_a_dead_process_does_not_block(tmp_path):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    os.setxattr(folder, runlock.HOLDER_ATTRIBUTE, json.dumps({"host": "elsewhere", "pid": 999999999}).encode())
    lock = runlock.acquire(folder)
    assert lock is not None and runlock.read_holder(folder)["pid"] == os.getpid()
    lock.release()
    assert list(folder.iterdir()) == []  # the lock adds nothing to the folder


def test_trainers_of_one_process_share_the_lock_and_release_it_on_close(tmp_path):
    first, second = _trainer(tmp_path / "ckpt"), _trainer(tmp_path / "ckpt")
    first.close()
    second.close()
    assert str((tmp_path / "ckpt").resolve()) not in runlock._HELD
    proc = subprocess.run([sys.executable, "-c", _HOLD, str(tmp_path / "ckpt")], input="", capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "held"  # released: another process takes it


@pytest.mark.parametrize("example", ["lm", "dcgan"])
def test_both_examples_refuse_a_second_run_on_one_output_folder(tmp_path, capsys, example):
    out = tmp_path / "run"  # the examples keep their checkpoints in <out>/checkpoints
    with _held(out / "checkpoints") as proc:
        if example == "lm":
            from lm import train

            code = train.main(["--device", "cpu", "--precision", "32-true", "--workers", "0", "--width", "32",
                               "--layers", "1", "--heads", "2", "--context", "16", "--batch-size", "8",
                               "--corpus-mb", "0.5", "--steps", "2", "--out", str(out)])
        else:
            from dcgan_runs import run

            code = run(["--data", "fake", "--steps", "2", "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0 and len(err) == 1 and f"pid {proc.pid}" in err[0] and "another run is writing" in err[0], err
    assert list((out / "checkpoints").iterdir()) == []


@pytest.mark.slow
def test_every_rank_of_a_second_fsdp_job_is_refused_and_none_waits(tmp_path, holder):
    from dist_scripts.common import HERE, run_ranks

    results = run_ranks(HERE / "fsdp_locked.py", [str(tmp_path / "ckpt")], timeout=120, expect_code=3)
    for rank, result in enumerate(results):
        lines = result.stdout.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"rank {rank}: another run is writing"), result.stdout
        assert f"pid {holder.pid}" in lines[0]
    assert list((tmp_path / "ckpt").iterdir()) == []


_HOLD_WITH_CHILD = """
import os, sys, time
from devplug.core.checkpoint import runlock
runlock.acquire(sys.argv[1])
if os.fork() == 0:  # a child (a data loader worker) shares the lock and outlives its parent by a moment
    time.sleep(3)
    os._exit(0)
print("held", flush=True)
sys.stdin.read()
"""


def test_the_lock_of_a_killed_run_whose_child_lingers_is_taken_over_once_the_child_ends(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", _HOLD_WITH_CHILD, str(tmp_path / "ckpt")], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        lock = runlock.acquire(tmp_path / "ckpt")  # waits for the orphaned child, then takes the lock
        assert lock is not None and runlock.read_holder(tmp_path / "ckpt")["pid"] == os.getpid()
        lock.release()
    finally:
        proc.kill()
        proc.wait()


def test_a_trainer_refused_at_construction_leaves_its_folder_unlocked(tmp_path):
    """A configuration refused after the folder was chosen (a format that cannot hold the strategy's state)
    does not keep the folder locked for the rest of the process."""
    folder = tmp_path / "ckpt"
    with pytest.raises(devplug.ConfigError, match="checkpoint_format='plain'"):
        devplug.Trainer(device="cpu", precision="32-true", progress=False, strategy="fsdp", checkpoint_format="plain",
                        checkpoints=devplug.CheckpointPolicy(directory=folder))
    assert str(folder.resolve()) not in runlock._HELD
    fixed = _trainer(folder)  # the corrected run takes it, and its close() lets go of it for good
    fixed.close()
    assert str(folder.resolve()) not in runlock._HELD


@pytest.mark.parametrize("where", ["a_file", "a_file/ckpt"])
def test_a_checkpoint_folder_a_file_stands_in_the_way_of_is_refused_at_construction(tmp_path, where):
    """Not after the steps up to the first save, with an OSError from inside the loop."""
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(CheckpointError) as info:
        _trainer(tmp_path / where)
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"cannot make the checkpoint folder {str(tmp_path / where)!r}")
    assert f"{str(tmp_path / 'a_file')!r} is a file, not a folder" in message
