"""A run folder used the way people do: a new run started in a folder that holds another run's checkpoints,
damaged files beside good ones, scores that tie or are not numbers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from paths import REPO

import devplug
from devplug import toolkit
from devplug.core.checkpoint.tempfiles import host_tag


def _train(folder: Path, steps: int, *, every: int, keep_last: int | None = 3, auto_resume: bool = False,
           seed: int = 0) -> devplug.Trainer:
    policy = devplug.CheckpointPolicy(directory=folder, every_n_steps=every, keep_last=keep_last,
                                      auto_resume=auto_resume)
    trainer = devplug.Trainer(device="cpu", precision="32-true", seed=seed, progress=False, checkpoints=policy,
                              stop_signals=(), count_flops=False, log_every=1000)
    model = trainer.setup(torch.nn.Linear(3, 1))
    opt = trainer.optimizer("sgd", model.parameters(), lr=0.1)
    data = torch.utils.data.TensorDataset(torch.randn(64, 3), torch.randn(64, 1))
    loader = trainer.dataloader(data, 2, num_workers=0)
    for _ in trainer.epochs(100, max_steps=steps):
        for x, y in loader:
            trainer.backward(torch.nn.functional.mse_loss(model(x), y))
            trainer.step(opt)
    trainer.close()
    return trainer


def _steps(folder: Path) -> list[int]:
    return sorted(int(p.name[5:12]) for p in folder.glob("step_*.pt"))


def test_a_new_run_in_a_folder_of_a_longer_run_keeps_its_own_checkpoints(tmp_path):
    folder = tmp_path / "ckpt"
    _train(folder, 12, every=4, keep_last=None)  # an earlier run left steps 4, 8, 12
    trainer = _train(folder, 6, every=2, keep_last=1)  # a new run (no resume) in the same folder
    assert _steps(folder) == [6]  # its own newest is kept, not the earlier run's step 12
    assert trainer.summary()["last_checkpoint"] == str(folder / "step_0000006.pt")
    aside = [p for p in folder.iterdir() if p.is_dir() and p.name.startswith("abandoned-")]
    assert len(aside) == 1  # every earlier checkpoint at or after its first save (step 2) is there, none lost
    assert sorted(p.name for p in aside[0].iterdir()) == ["step_0000004.pt", "step_0000008.pt", "step_0000012.pt"]
    resumed = _train(folder, 8, every=2, keep_last=1, auto_resume=True)  # resumes the new run, not the old one
    assert resumed.summary()["last_checkpoint"] == str(folder / "step_0000008.pt")
    assert torch.load(folder / "step_0000008.pt", weights_only=True)["global_step"] == 8


KILLED_WRITING_AN_OUTPUT = r"""
import os, signal, sys
from devplug import toolkit
from devplug.core.checkpoint.tempfiles import host_tag

def half_then_killed(handle):
    handle.write(b"{")
    os.kill(os.getpid(), signal.SIGKILL)

toolkit.write_atomically(sys.argv[1], half_then_killed)
"""


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_an_output_a_killed_run_was_writing_leaves_no_temp_file_for_good(tmp_path):
    # the run folder's summary and sample grids are written through toolkit.write_atomically, outside checkpoints/
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", KILLED_WRITING_AN_OUTPUT, str(tmp_path / "summary.json")],
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert [p.name.startswith(".summary.json.") for p in tmp_path.iterdir()] == [True]  # its temporary file
    toolkit.write_atomically(tmp_path / "summary.json", lambda handle: handle.write(b"{}"))  # the next run's
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]


def test_the_periodic_save_due_at_the_last_step_is_made_without_at_end(tmp_path):
    folder = tmp_path / "ckpt"
    policy = devplug.CheckpointPolicy(directory=folder, every_n_steps=2, keep_last=None, at_end=False)
    trainer = devplug.Trainer(device="cpu", precision="32-true", seed=0, progress=False, checkpoints=policy,
                              stop_signals=(), count_flops=False, log_every=1000)
    model = trainer.setup(torch.nn.Linear(3, 1))
    opt = trainer.optimizer("sgd", model.parameters(), lr=0.1)
    loader = trainer.dataloader(torch.utils.data.TensorDataset(torch.randn(40, 3)), 2, num_workers=0)
    for _ in trainer.epochs(1, max_steps=6):  # max_steps ends the run inside the epoch
        for (x,) in loader:
            trainer.backward(model(x).square().mean())
            trainer.step(opt)
    trainer.close()
    assert _steps(folder) == [2, 4, 6]  # step 6 is due like 2 and 4, though no batch is asked for after it


def _aged(path: Path, seconds: float) -> None:
    stamp = path.stat().st_mtime - seconds
    os.utime(path, (stamp, stamp))


def test_temp_files_a_restarted_container_cannot_tell_apart_go_once_an_hour_old(tmp_path):
    # A pod restarted on another node names its host differently; a container's training process is pid 1 on
    # every restart, so a killed save's pid is alive again. Neither writer can be told dead by its pid.
    host = host_tag()
    names = [f".step_0000004.pt.pod-7f9c-{host}.1.0123abcd.tmp",   # another host (the pod before the restart)
             f".step_0000004.pt.{host}.{os.getpid()}.0123abcd.tmp"]  # this host, a pid that is alive again
    for name in names:
        (tmp_path / name).write_bytes(b"half a checkpoint")
        _aged(tmp_path / name, 2 * 3600)
    (tmp_path / "step_0000006.pt").write_bytes(b"checkpoint")  # the restarted run wrote the folder since
    assert sorted(p.name for p in toolkit.remove_stale_temp_files(tmp_path)) == sorted(names)
    for name in names:  # written a minute ago, their writer may still rename them: kept
        (tmp_path / name).write_bytes(b"half a checkpoint")
        _aged(tmp_path / name, 60)
    assert toolkit.remove_stale_temp_files(tmp_path) == []


def test_resuming_an_older_checkpoint_of_a_folder_this_run_cannot_write_goes_on(tmp_path, monkeypatch, caplog):
    # a run folder of a read-only snapshot, resumed to evaluate: the newer checkpoints cannot be moved aside
    shared = tmp_path / "shared"
    _train(shared, 6, every=2, keep_last=None)
    real_mkdir = Path.mkdir

    def read_only(self, *args, **kwargs):
        if self.parent == shared:
            raise PermissionError(13, "Permission denied", str(self))
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", read_only)
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False, stop_signals=(), count_flops=False,
                              checkpoints=devplug.CheckpointPolicy(directory=shared, every_n_steps=2))
    model = trainer.setup(torch.nn.Linear(3, 1))
    trainer.optimizer("sgd", model.parameters(), lr=0.1)
    with caplog.at_level("WARNING", logger="devplug"):
        resumed = trainer.resume(shared / "step_0000002.pt")
    assert resumed is not None and resumed.step == 2 and resumed.set_aside is None and resumed.set_aside_count == 0
    assert _steps(shared) == [2, 4, 6]  # untouched
    assert "could not move" in caplog.text and "Permission denied" in caplog.text


def test_a_sharded_saves_staging_folder_a_restarted_pod_left_goes_once_an_hour_old(tmp_path):
    staging = tmp_path / ".step_0000004.pt.pod-7f9c.1.partial"  # written by a pod before its restart (another host)
    staging.mkdir()
    (staging / "__0_0.distcp").write_bytes(b"half a shard")
    (staging / ".writer").write_text("pod-7f9c 1\n")
    (tmp_path / "step_0000006.pt").write_bytes(b"checkpoint")  # the restarted run wrote the folder since
    assert toolkit.remove_stale_temp_files(tmp_path) == []  # young: its writer may still be writing
    for path in (*staging.iterdir(), staging):
        _aged(path, 2 * 3600)
    assert toolkit.remove_stale_temp_files(tmp_path) == [staging]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_0000006.pt"]
