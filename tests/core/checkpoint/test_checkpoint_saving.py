"""Saving checkpoints: non-finite state is refused, files follow the umask, temp files never accumulate."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from paths import REPO

import devplug
from devplug.core.checkpoint.file import read_checkpoint
from devplug.core.checkpoint.policy import RunCheckpoints
from devplug.toolkit import remove_stale_temp_files

HOST = re.sub(r"[^A-Za-z0-9_-]", "-", socket.gethostname())


def build() -> tuple[devplug.Trainer, torch.nn.Module, torch.optim.Optimizer]:
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False)
    torch.manual_seed(0)
    model = trainer.setup(torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1)), "net")
    opt = trainer.optimizer("adam", model.parameters(), lr=1e-2)
    trainer.backward(model(torch.randn(2, 3)).sum())
    trainer.step(opt)
    return trainer, model, opt


def temp_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


# ---- non-finite state is never written -----------------------------------------------------------------------
def test_nan_in_a_weight_is_refused_and_earlier_checkpoints_stay(tmp_path):
    trainer, model, _ = build()
    earlier = Path(trainer.save(tmp_path / "step_1.pt"))
    kept = earlier.read_bytes()
    with torch.no_grad():
        model[1].weight[0, 2] = float("nan")
    with pytest.raises(devplug.NonFiniteLossError) as caught:
        trainer.save(tmp_path / "step_2.pt")
    message = str(caught.value)
    assert message.startswith(f"not saving checkpoint {str(tmp_path / 'step_2.pt')!r}: non-finite values (NaN or inf) "
                              "in net.1.weight;")
    assert "earlier checkpoints are kept" in message and "\n" not in message
    with pytest.raises(devplug.NonFiniteLossError):
        trainer.save(earlier)  # not over a good checkpoint either
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_1.pt"] and earlier.read_bytes() == kept


def test_a_float8_tensor_without_isfinite_is_saved_and_its_nan_refused(tmp_path):
    """float8_e4m3fn (fp8 weights kept by a model) has no isfinite kernel: the check widens it, never fails on it."""
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False)
    net = torch.nn.Linear(3, 4)
    net.register_buffer("codes", torch.linspace(-2, 2, 8).to(torch.float8_e4m3fn))
    model = trainer.setup(net, "net")
    trainer.optimizer("adam", model.parameters(), lr=1e-2)
    path = trainer.save(tmp_path / "ok.pt")
    assert read_checkpoint(path)["modules"]["net"]["codes"].dtype == torch.float8_e4m3fn
    model.codes[3] = float("nan")
    with pytest.raises(devplug.NonFiniteLossError, match=r"in net\.codes;"):
        trainer.save(tmp_path / "nan.pt")
    assert not (tmp_path / "nan.pt").exists()


def test_inf_in_optimizer_state_is_named(tmp_path):
    trainer, _, opt = build()
    first = next(iter(opt.state.values()))
    first["exp_avg_sq"][0, 0] = float("inf")
    with pytest.raises(devplug.NonFiniteLossError, match=r"in optimizer 'net' exp_avg_sq of net.0.weight;"):
        trainer.save(tmp_path / "ck.pt")
    assert list(tmp_path.iterdir()) == []


# ---- permissions ---------------------------------------------------------------------------------------------
@pytest.mark.skipif(os.name == "nt", reason="POSIX permissions")
@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_checkpoints_follow_the_umask_like_other_outputs(tmp_path, umask):
    trainer, *_ = build()
    old = os.umask(umask)
    try:
        path = Path(trainer.save(tmp_path / "ck.pt"))
        (tmp_path / "other.txt").write_text("x")
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == (tmp_path / "other.txt").stat().st_mode & 0o777 == 0o666 & ~umask


# ---- temp files ------------------------------------------------------------------------------------------------
def test_a_temp_file_names_its_writer(tmp_path, monkeypatch):
    trainer, *_ = build()
    seen = []
    real_save = torch.save

    def spy(obj, handle, *args, **kwargs):
        seen.extend(temp_files(tmp_path))
        return real_save(obj, handle, *args, **kwargs)

    monkeypatch.setattr(torch, "save", spy)
    trainer.save(tmp_path / "ck.pt")
    [name] = seen
    assert re.fullmatch(rf"\.ck\.pt\.{re.escape(HOST)}\.{os.getpid()}\.[0-9a-f]{{8}}\.tmp", name)
    assert temp_files(tmp_path) == []


def _dead_pid() -> int:
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(child.stdout)


def test_stale_temp_files_of_gone_writers_are_removed_and_live_ones_kept(tmp_path):
    dead = _dead_pid()
    names = {
        "dead": f".ck.pt.{HOST}.{dead}.0123abcd.tmp",
        "live (this process)": f".ck.pt.{HOST}.{os.getpid()}.0123abcd.tmp",
        "other host": f".ck.pt.elsewhere-{HOST}.{dead}.0123abcd.tmp",
        "not devplug's": ".ck.pt.tmp",
    }
    for name in names.values():
        (tmp_path / name).write_bytes(b"partial")
    removed = remove_stale_temp_files(tmp_path)
    assert [p.name for p in removed] == [names["dead"]]
    assert temp_files(tmp_path) == sorted(n for k, n in names.items() if k != "dead")


def test_staging_folders_of_sharded_saves_whose_writer_is_gone_are_removed_and_the_rest_kept(tmp_path):
    writers = {"dead": f"{HOST} {_dead_pid()}", "live": f"{HOST} {os.getpid()}",
               "other host": f"elsewhere-{HOST} {_dead_pid()}", "unnamed": None}
    for i, (_kind, writer) in enumerate(writers.items()):
        staging = tmp_path / f".step_{i}.pt.partial"
        staging.mkdir()
        (staging / "__0_0.distcp").write_bytes(b"half")
        if writer is not None:
            (staging / ".writer").write_text(writer + "\n")
    removed = remove_stale_temp_files(tmp_path)
    assert [p.name for p in removed] == [".step_0.pt.partial"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".step_1.pt.partial", ".step_2.pt.partial",
                                                          ".step_3.pt.partial"]


def test_the_next_save_removes_stale_temp_files(tmp_path):
    stale = tmp_path / f".step_3.pt.{HOST}.{_dead_pid()}.00ff00ff.tmp"
    stale.write_bytes(b"partial")
    build()[0].save(tmp_path / "step_4.pt")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_4.pt"]


KILLED_AT_THE_INDEX = r"""
import os, signal, sys
import devplug
from devplug.core.checkpoint.policy import INDEX_NAME, RunCheckpoints

real = os.replace

def replace(src, dst, *args, **kwargs):
    if os.path.basename(dst) == INDEX_NAME:  # killed between the index's temporary file and its rename
        os.kill(os.getpid(), signal.SIGKILL)
    return real(src, dst, *args, **kwargs)

os.replace = replace
runs = RunCheckpoints(devplug.CheckpointPolicy(directory=sys.argv[1], monitor="loss"))
runs.save(1, lambda path: path.write_bytes(b"checkpoint"), 0.5)
"""


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_the_checkpoint_index_of_a_killed_run_leaves_no_temp_file_for_good(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", KILLED_AT_THE_INDEX, str(tmp_path)], capture_output=True, text=True,
                          timeout=120, env=env)
    assert done.returncode == -signal.SIGKILL, done.stderr
    [left] = temp_files(tmp_path)  # the index's temporary file, named after its (now dead) writer
    assert left.startswith(".checkpoints.json.")
    runs = RunCheckpoints(devplug.CheckpointPolicy(directory=tmp_path, monitor="loss"))
    runs.save(2, lambda path: path.write_bytes(b"checkpoint"), 0.25)  # the next run's first save
    assert temp_files(tmp_path) == []
    assert json.loads((tmp_path / "checkpoints.json").read_text()) == {"step_0000002.pt": 0.25}


KILL_LOOP = r"""
import json, os, random, signal, sys, time
import torch
torch.set_num_threads(1)  # no thread pool, so forking is safe
import devplug

folder = sys.argv[1]
trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False,
                          plugin_manager=devplug.create_plugin_manager(autoload=False))
trainer.setup(torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(8)]), "net")  # no optimizer: no dynamo
rng, report = random.Random(11), []
for attempt in range(4):
    pid = os.fork()
    if pid == 0:
        while True:
            trainer.save(os.path.join(folder, "ck.pt"))
    mine = f".{pid}."
    deadline = time.monotonic() + 30
    while not any(mine in name for name in os.listdir(folder)) and time.monotonic() < deadline:
        time.sleep(0.0005)
    time.sleep(rng.uniform(0, 0.004))  # at a random moment of a save
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    report.append(sorted(n for n in os.listdir(folder) if n.endswith(".tmp")))
print(json.dumps(report))
"""


@pytest.mark.skipif(not hasattr(os, "fork") or not hasattr(signal, "SIGKILL"), reason="needs fork and SIGKILL")
def test_saves_killed_at_random_moments_leave_at_most_one_temp_file(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", KILL_LOOP, str(tmp_path)], capture_output=True, text=True,
                          timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.splitlines()[-1])
    assert all(len(left) <= 1 for left in report), report  # each kill leaves at most its own temp file
    assert any(report), "no kill landed inside a save; the test did not exercise a killed save"
    if (tmp_path / "ck.pt").exists():  # the last completed save is intact
        read_checkpoint(tmp_path / "ck.pt")
    build()[0].save(tmp_path / "ck.pt")
    assert temp_files(tmp_path) == []


# ---- the checks before a save read the state back once, not once per tensor ---------------------------------------
def test_a_save_checks_the_optimizer_state_in_fused_reductions(tmp_path, monkeypatch):
    # the finiteness of every weight and optimizer state tensor is read back in one fused reduction per
    # device and dtype: a check and a host read per state tensor made a final checkpoint slower than its write
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False)
    model = trainer.setup(torch.nn.Sequential(*(torch.nn.Linear(4, 4) for _ in range(10))), "net")
    opt = trainer.optimizer("adam", model.parameters(), lr=1e-2)
    trainer.backward(model(torch.randn(2, 4)).sum())
    trainer.step(opt)
    calls = []
    isfinite = torch.isfinite
    monkeypatch.setattr(torch, "isfinite", lambda t: calls.append(t.numel()) or isfinite(t))
    trainer.save(tmp_path / "step_1.pt")
    assert len(calls) <= 2, calls  # the weights' check and the optimizer state's (20 parameters, 40 moments)
    read_checkpoint(tmp_path / "step_1.pt")


# ---- temporary files of earlier versions, which name no host ---------------------------------------------------
LEGACY = [".checkpoints.json.4242.tmp", ".step_0000002.pt.k2x_9q0a.tmp"]  # the index's, a checkpoint's (mkstemp)


def _aged(path: Path, seconds: float) -> None:
    stamp = path.stat().st_mtime - seconds
    os.utime(path, (stamp, stamp))


def test_an_earlier_versions_temp_files_left_for_an_hour_are_removed(tmp_path):
    for name in [*LEGACY, ".notes.json.4242.tmp", ".model.pt.k2x_9q0a.tmp"]:  # the last two: not devplug's names
        (tmp_path / name).write_bytes(b"partial")
        _aged(tmp_path / name, 2 * 3600)
    (tmp_path / "step_0000003.pt").write_bytes(b"checkpoint")  # written now, after them
    removed = remove_stale_temp_files(tmp_path)
    assert sorted(p.name for p in removed) == sorted(LEGACY)
    assert temp_files(tmp_path) == [".model.pt.k2x_9q0a.tmp", ".notes.json.4242.tmp"]


def test_an_earlier_versions_temp_file_is_kept_while_it_may_be_written(tmp_path):
    """Written a minute ago: its writer (an older devplug, maybe on another host of a shared file system) may
    still rename it, and its pid says nothing on this host."""
    for name in LEGACY:
        (tmp_path / name).write_bytes(b"partial")
        _aged(tmp_path / name, 60)
    (tmp_path / "step_0000003.pt").write_bytes(b"checkpoint")
    assert remove_stale_temp_files(tmp_path) == []
    assert temp_files(tmp_path) == sorted(LEGACY)


def test_the_age_of_an_earlier_versions_temp_file_is_read_on_the_folders_clock(tmp_path):
    """A folder untouched for days (a run resumed long after) does not make its files old: only a write to the
    folder an hour after them does, so a host whose clock runs ahead removes nothing young either."""
    for name in [*LEGACY, "step_0000001.pt"]:
        (tmp_path / name).write_bytes(b"partial")
        _aged(tmp_path / name, 3 * 86400)
    _aged(tmp_path, 3 * 86400)
    assert remove_stale_temp_files(tmp_path) == []
    runs = RunCheckpoints(devplug.CheckpointPolicy(directory=tmp_path, monitor="loss"))
    runs.save(2, lambda path: path.write_bytes(b"checkpoint"), 0.25)  # the resumed run's first save sweeps them
    assert temp_files(tmp_path) == []
