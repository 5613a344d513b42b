"""Runs the library manages: the checkpoint policy (periodic, keep-last, keep-best, at the end), auto-resume
from the newest intact checkpoint, stop requests and early stopping."""

from __future__ import annotations

import logging
import multiprocessing
import subprocess
from pathlib import Path

import pytest
import torch
from dist_scripts.common import HERE, RANK_PRELOAD, clean_env, run_ranks
from toys import Clock, train_on_a_clock

import devplug
from devplug.core.checkpoint.tempfiles import host_tag

SCRIPTS = HERE.parent / "run_scripts"


def _loop(tmp_path: Path, policy: devplug.CheckpointPolicy, *, epochs: int = 1, metric=None, batches: int = 12,
          stop_at: int | None = None) -> devplug.Trainer:
    trainer = devplug.Trainer(device="cpu", precision="32-true", seed=0, progress=False, checkpoints=policy,
                              stop_signals=(), count_flops=False, log_every=1000)
    model = trainer.setup(torch.nn.Linear(3, 1))
    opt = trainer.optimizer("sgd", model.parameters(), lr=0.1)
    data = torch.utils.data.TensorDataset(torch.randn(batches * 2, 3), torch.randn(batches * 2, 1))
    loader = trainer.dataloader(data, 2, num_workers=0)
    for _ in trainer.epochs(epochs):
        for x, y in loader:
            trainer.backward(torch.nn.functional.mse_loss(model(x), y))
            trainer.step(opt)
            if metric is not None:
                trainer.log(score=metric(trainer.global_step))
            if stop_at is not None and trainer.global_step == stop_at:
                trainer.request_stop("enough")
    trainer.close()
    return trainer


def _dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def _names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob("step_*.pt"))


def test_saves_every_n_steps_and_at_the_end_and_keeps_the_last_k(tmp_path):
    policy = devplug.CheckpointPolicy(directory=tmp_path / "ckpt", every_n_steps=5, keep_last=2)
    trainer = _loop(tmp_path, policy)
    assert _names(tmp_path / "ckpt") == ["step_0000010.pt", "step_0000012.pt"]  # 5 pruned; 12 at the end
    assert trainer.summary()["last_checkpoint"] == str(tmp_path / "ckpt" / "step_0000012.pt")
    assert torch.load(tmp_path / "ckpt" / "step_0000010.pt", weights_only=True)["global_step"] == 10
    assert not list((tmp_path / "ckpt").glob(".*.tmp"))


def test_keeps_the_best_k_by_a_logged_metric_besides_the_last(tmp_path):
    scores = {2: 5.0, 4: 1.0, 6: 3.0, 8: 0.5, 10: 9.0, 12: 7.0}
    policy = devplug.CheckpointPolicy(directory=tmp_path / "ckpt", every_n_steps=2, keep_last=1, keep_best=2,
                                      monitor="score", mode="min", at_end=False)
    _loop(tmp_path, policy, metric=lambda step: torch.tensor(scores.get(step, 100.0)))
    assert _names(tmp_path / "ckpt") == ["step_0000004.pt", "step_0000008.pt", "step_0000012.pt"]
    policy = devplug.CheckpointPolicy(directory=tmp_path / "max", every_n_steps=2, keep_last=1, keep_best=1,
                                      monitor="score", mode="max", at_end=False)
    _loop(tmp_path, policy, metric=lambda step: scores.get(step, -1.0))
    assert _names(tmp_path / "max") == ["step_0000010.pt", "step_0000012.pt"]


def test_never_prunes_the_only_intact_checkpoint(tmp_path):
    policy = devplug.CheckpointPolicy(directory=tmp_path / "ckpt", every_n_steps=3, keep_last=1, keep_best=1,
                                      monitor="score", mode="min")
    _loop(tmp_path, policy, metric=lambda step: float(step))  # the best is the oldest; the newest stays too
    assert _names(tmp_path / "ckpt") == ["step_0000003.pt", "step_0000012.pt"]


def test_a_policy_is_validated_with_one_clear_line():
    with pytest.raises(ValueError, match="keep_best needs monitor"):
        devplug.CheckpointPolicy(directory="x", keep_best=2)
    with pytest.raises(ValueError, match="every_n_steps must be a positive integer"):
        devplug.CheckpointPolicy(directory="x", every_n_steps=0)
    with pytest.raises(devplug.ConfigError, match="checkpoints"):
        devplug.Trainer(device="cpu", checkpoints="runs/x", progress=False)


def test_auto_resume_skips_a_damaged_newest_checkpoint_with_a_warning(tmp_path, caplog):
    folder = tmp_path / "ckpt"
    _loop(tmp_path, devplug.CheckpointPolicy(directory=folder, every_n_steps=4, keep_last=None), stop_at=8)
    assert _names(folder) == ["step_0000004.pt", "step_0000008.pt"]
    (folder / "step_0000008.pt").write_bytes(b"not a checkpoint")
    policy = devplug.CheckpointPolicy(directory=folder, every_n_steps=4, keep_last=None, auto_resume=True)
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False, checkpoints=policy,
                              stop_signals=(), count_flops=False)
    model = trainer.setup(torch.nn.Linear(3, 1))
    trainer.optimizer("sgd", model.parameters(), lr=0.1)
    with caplog.at_level(logging.WARNING, logger="devplug"):
        extra = trainer.resume()
    assert extra is not None and trainer.global_step == 4
    assert "skipping damaged checkpoint" in caplog.text and "step_0000008.pt" in caplog.text
    aside = list(tmp_path.glob("ckpt/abandoned-*/step_0000008.pt"))  # the newer (damaged) one is set aside
    assert len(aside) == 1 and _names(folder) == ["step_0000004.pt"]


def test_resume_in_a_new_folder_is_a_new_run_and_a_mismatch_is_an_error(tmp_path):
    policy = devplug.CheckpointPolicy(directory=tmp_path / "ckpt", auto_resume=True)
    trainer = devplug.Trainer(device="cpu", progress=False, checkpoints=policy, stop_signals=())
    trainer.setup(torch.nn.Linear(3, 1))
    assert trainer.resume() is None and trainer.global_step == 0
    _loop(tmp_path, devplug.CheckpointPolicy(directory=tmp_path / "ckpt", every_n_steps=6))
    other = devplug.Trainer(device="cpu", progress=False, checkpoints=policy, stop_signals=())
    model = other.setup(torch.nn.Linear(5, 1))
    other.optimizer("sgd", model.parameters(), lr=0.1)
    with pytest.raises(devplug.CheckpointMismatchError):
        other.resume()  # another model: not a reason to go back further


def _fresh(policy: devplug.CheckpointPolicy | None = None, **options) -> devplug.Trainer:
    """A trainer holding the same model and optimizer as `_loop`, not yet trained (to resume into)."""
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False, checkpoints=policy,
                              stop_signals=(), count_flops=False, **options)
    model = trainer.setup(torch.nn.Linear(3, 1))
    trainer.optimizer("sgd", model.parameters(), lr=0.1)
    return trainer


def test_resume_returns_a_record_of_the_file_the_skipped_ones_and_the_ones_set_aside(tmp_path, caplog):
    folder = tmp_path / "ckpt"
    _loop(tmp_path, devplug.CheckpointPolicy(directory=folder, every_n_steps=3, keep_last=None))
    (folder / "step_0000012.pt").write_bytes(b"not a checkpoint")
    trainer = _fresh(devplug.CheckpointPolicy(directory=folder, every_n_steps=3))
    with caplog.at_level(logging.WARNING, logger="devplug"):
        resumed = trainer.resume()
    assert isinstance(resumed, devplug.Resumed)
    assert (resumed.path, resumed.step, resumed.epoch) == (folder / "step_0000009.pt", 9, 0)
    [(skipped, reason)] = resumed.skipped
    assert skipped == folder / "step_0000012.pt" and "not a checkpoint" in reason
    assert resumed.set_aside_count == 1 and resumed.set_aside is not None
    assert resumed.set_aside.parent == folder and resumed.set_aside.name.startswith("abandoned-")
    assert "skipping damaged checkpoint step_0000012.pt" in caplog.text


def test_resume_from_an_older_file_of_its_own_folder_sets_aside_the_newer_ones(tmp_path):
    folder = tmp_path / "run"
    _loop(tmp_path, devplug.CheckpointPolicy(directory=folder, every_n_steps=4, keep_last=None))
    trainer = _fresh(devplug.CheckpointPolicy(directory=folder, every_n_steps=4))
    resumed = trainer.resume(folder / "step_0000004.pt")
    assert resumed is not None and resumed.step == trainer.global_step == 4 and resumed.skipped == ()
    assert resumed.set_aside_count == 2 and _names(folder) == ["step_0000004.pt"]
    assert _names(resumed.set_aside) == ["step_0000008.pt", "step_0000012.pt"]
    assert trainer.checkpoint_now() is None  # step 4 is the resumed checkpoint: nothing new to save
    trainer.close()


def test_resume_from_another_runs_folder_leaves_that_folder_as_it_is(tmp_path):
    # the other run may still be writing it, and its own auto-resume must find its newest checkpoint there
    old = tmp_path / "old"
    _loop(tmp_path, devplug.CheckpointPolicy(directory=old, every_n_steps=4, keep_last=None))
    stale = old / f".step_0000016.pt.{host_tag()}.{_dead_pid()}.0123abcd.tmp"  # a killed save's, on this host
    stale.write_bytes(b"half a checkpoint")
    for policy in (devplug.CheckpointPolicy(directory=tmp_path / "new", every_n_steps=4), None):
        trainer = _fresh(policy)
        resumed = trainer.resume(old / "step_0000004.pt")
        assert resumed is not None and resumed.step == trainer.global_step == 4 and resumed.skipped == ()
        assert resumed.set_aside is None and resumed.set_aside_count == 0
        assert _names(old) == ["step_0000004.pt", "step_0000008.pt", "step_0000012.pt"] and stale.exists()
        trainer.close()
    assert _fresh().resume(old).path == old / "step_0000012.pt"  # the other run resumes where it was
    (old / "step_0000004.pt").write_bytes(b"garbage")
    with pytest.raises(devplug.CheckpointError, match="not a checkpoint"):
        _fresh().resume(old / "step_0000004.pt")  # a file named explicitly is never skipped
    with pytest.raises(devplug.CheckpointError, match="does not exist"):
        _fresh().resume(tmp_path / "nope.pt")
    (tmp_path / "empty").mkdir()
    with pytest.raises(devplug.CheckpointError, match=r"no checkpoint \(step_\*\.pt\) in"):
        _fresh().resume(tmp_path / "empty")  # resume(path) needs no policy; an empty folder is an error


def test_resume_from_a_run_folder_takes_its_newest_intact_checkpoint(tmp_path):
    folder = tmp_path / "ckpt"
    _loop(tmp_path, devplug.CheckpointPolicy(directory=folder, every_n_steps=5, keep_last=None))
    resumed = _fresh().resume(folder)
    assert resumed is not None and resumed.path.name == "step_0000012.pt" and resumed.set_aside is None
    with pytest.raises(devplug.ConfigError, match=r"resume\(path\)"):
        _fresh().resume()  # no policy and no path: nothing to resume from


def _diverging_loop(tmp_path: Path, nonfinite: str) -> devplug.Trainer:
    policy = devplug.CheckpointPolicy(directory=tmp_path / "ckpt", every_n_steps=2, keep_last=None)
    trainer = devplug.Trainer(device="cpu", precision="32-true", seed=0, progress=False, checkpoints=policy,
                              stop_signals=(), count_flops=False, log_every=1000, nonfinite=nonfinite)
    model = trainer.setup(torch.nn.Linear(3, 1))
    opt = trainer.optimizer("sgd", model.parameters(), lr=0.1)
    loader = trainer.dataloader(torch.utils.data.TensorDataset(torch.randn(12, 3), torch.randn(12, 1)), 2,
                                num_workers=0)
    for _ in trainer.epochs(1):
        for x, y in loader:
            trainer.backward(torch.nn.functional.mse_loss(model(x), y))
            trainer.step(opt)
            if trainer.global_step == 3:
                with torch.no_grad():
                    model.weight.fill_(float("nan"))
    trainer.close()
    return trainer


@pytest.mark.parametrize("nonfinite", ["warn", "ignore"])
def test_a_non_finite_checkpoint_is_not_written_a_warning_says_so_and_training_goes_on(tmp_path, caplog,
                                                                                     nonfinite):
    with caplog.at_level(logging.WARNING, logger="devplug"):
        trainer = _diverging_loop(tmp_path, nonfinite)
    assert trainer.global_step == 6 and _names(tmp_path / "ckpt") == ["step_0000002.pt"]
    warned = [r.getMessage() for r in caplog.records if "not saving checkpoint" in r.getMessage()]
    assert len(warned) == 2 and "step_0000004.pt" in warned[0] and "step_0000006.pt" in warned[1]
    assert "non-finite" in warned[0] and f"nonfinite={nonfinite!r}" in warned[0]


def test_a_non_finite_checkpoint_raises_under_nonfinite_raise(tmp_path):
    with pytest.raises(devplug.NonFiniteLossError, match=r"step_0000004\.pt"):
        _diverging_loop(tmp_path, "raise")
    assert _names(tmp_path / "ckpt") == ["step_0000002.pt"]


def test_a_full_disk_is_one_line_naming_the_file_and_the_intact_previous_checkpoint(tmp_path, monkeypatch):
    import errno

    real_save = devplug.Trainer.save

    def save(self, path, **extra):
        if self.global_step >= 8:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(self, path, **extra)

    monkeypatch.setattr(devplug.Trainer, "save", save)
    with pytest.raises(devplug.CheckpointError) as info:
        _loop(tmp_path, devplug.CheckpointPolicy(directory=tmp_path / "ckpt", every_n_steps=4))
    message = str(info.value)
    assert "\n" not in message and message.startswith("the disk is full: could not write")
    assert "step_0000008.pt (No space left on device)" in message
    assert f"the previous checkpoint {tmp_path / 'ckpt' / 'step_0000004.pt'} is intact" in message
    assert "free some space" in message and _names(tmp_path / "ckpt") == ["step_0000004.pt"]


def test_a_folder_that_stops_taking_files_is_one_line_naming_the_file_and_the_intact_previous(tmp_path,
                                                                                                monkeypatch):
    """Permission taken away (or the disk remounted read-only) mid-run: one line, as for a full disk."""
    import errno

    from devplug.core.checkpoint import tempfiles

    real_create = tempfiles.create_temp

    def create_temp(target):
        if target.name == "step_0000008.pt":
            raise PermissionError(errno.EACCES, "Permission denied", str(target.parent / ".tmp"))
        return real_create(target)

    monkeypatch.setattr(tempfiles, "create_temp", create_temp)
    with pytest.raises(devplug.CheckpointError) as info:
        _loop(tmp_path, devplug.CheckpointPolicy(directory=tmp_path / "ckpt", every_n_steps=4))
    message = str(info.value)
    assert "\n" not in message and message.startswith("could not write")
    assert "step_0000008.pt (Permission denied)" in message
    assert f"the previous checkpoint {tmp_path / 'ckpt' / 'step_0000004.pt'} is intact" in message
    assert _names(tmp_path / "ckpt") == ["step_0000004.pt"]


def test_checkpoint_now_saves_this_step_by_the_policy_once_and_no_index_without_a_monitor(tmp_path):
    policy = devplug.CheckpointPolicy(directory=tmp_path / "ckpt", every_n_steps=100, at_end=False, keep_last=1)
    trainer = _loop(tmp_path, policy, batches=5)
    assert _names(tmp_path / "ckpt") == []
    assert trainer.checkpoint_now() == str(tmp_path / "ckpt" / "step_0000005.pt")
    assert trainer.checkpoint_now() is None  # already saved at this step
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["step_0000005.pt"]  # no checkpoints.json
    with pytest.raises(devplug.ConfigError, match="checkpoint policy"):
        _fresh().checkpoint_now()


def test_request_stop_ends_the_loop_after_that_step_with_the_reason(tmp_path):
    policy = devplug.CheckpointPolicy(directory=tmp_path / "ckpt")
    trainer = _loop(tmp_path, policy, epochs=3, stop_at=5)
    assert trainer.global_step == 5 and trainer.exit_code == 0
    assert trainer.summary()["stop_reason"] == "enough"
    assert _names(tmp_path / "ckpt") == ["step_0000005.pt"]  # saved at the end, as after a signal


def test_early_stopping_stops_at_the_expected_step_on_a_scripted_metric():
    values = [5.0, 4.0, 4.5, 3.9, 3.95, 3.91, 3.92, 1.0]
    stopper = devplug.EarlyStopping(patience=3, min_delta=0.01, mode="min")
    stopped_at = next(i for i, v in enumerate(values) if stopper.update(v))
    assert stopped_at == 6 and stopper.best == 3.9 and "patience 3" in stopper.reason
    nan = devplug.EarlyStopping(patience=1, mode="max")
    assert not nan.update(1.0) and nan.update(float("nan"))  # NaN never improves
    assert nan.reason == "early stopping: no improvement of more than 0 over the best value 1 in 1 updates (patience 1)"
    diverged = devplug.EarlyStopping(patience=2)
    assert not diverged.update(float("nan")) and diverged.update(float("inf"))
    assert "no finite value in 2 updates" in diverged.reason and "None" not in diverged.reason
    restored = devplug.EarlyStopping(patience=3)
    restored.load_state_dict(stopper.state_dict())
    assert restored.best == 3.9 and restored.bad_updates == 3


def test_an_end_of_epoch_checkpoint_resumes_at_the_next_epoch(tmp_path):
    evaluated = []

    def run(resume: bool) -> devplug.Trainer:
        trainer = devplug.Trainer(device="cpu", precision="32-true", seed=0, progress=False, stop_signals=())
        model = trainer.setup(torch.nn.Linear(3, 1))
        opt = trainer.optimizer("sgd", model.parameters(), lr=0.1)
        loader = trainer.dataloader(torch.utils.data.TensorDataset(torch.randn(8, 3), torch.randn(8, 1)), 2,
                                    num_workers=0)
        if resume:
            trainer.load(tmp_path / "epoch0.pt")
        for epoch in trainer.epochs(2):
            for x, y in loader:
                trainer.backward(torch.nn.functional.mse_loss(model(x), y))
                trainer.step(opt)
            evaluated.append(epoch)
            if epoch == 0 and not resume:
                trainer.save(tmp_path / "epoch0.pt")
                break
        return trainer

    run(resume=False)
    resumed = run(resume=True)
    assert evaluated == [0, 1] and resumed.global_step == 8  # epoch 0's evaluation is not run again


@pytest.mark.slow
def test_auto_resume_after_sigkill_at_ten_points_ends_equal_to_the_uninterrupted_run(tmp_path, monkeypatch):
    # Each run is its own process, forked from a server that imported torch and devplug once (an interpreter's
    # start is most of a run's time), and SIGKILLs itself where asked.
    monkeypatch.syspath_prepend(str(SCRIPTS))
    import kill_resume

    forks = multiprocessing.get_context("forkserver")
    forks.set_forkserver_preload([*RANK_PRELOAD, "kill_resume"])  # the rank tests' server may be this one
    env = clean_env()

    def run(folder: Path, *args: str) -> int | None:
        process = forks.Process(target=kill_resume.run_in_child, args=(["--dir", str(folder), *args], env))
        process.start()
        process.join(120)
        if process.is_alive():
            process.kill()
            pytest.fail(f"kill_resume.py {' '.join(args)} did not end within 120 s")
        return process.exitcode

    assert run(tmp_path / "whole") == 0
    kills = [("2", "step"), ("3", "save"), ("5", "step"), ("7", "step"), ("9", "save"), ("11", "step"),
             ("13", "step"), ("17", "step"), ("20", "step"), ("23", "step")]
    for step, phase in kills:
        assert run(tmp_path / "killed", "--kill-at", step, "--phase", phase) == -9
        checkpoints = tmp_path / "killed" / "checkpoints"
        assert len(_names(checkpoints)) <= 2  # keep_last=2 holds after every kill
    assert run(tmp_path / "killed") == 0
    whole = torch.load(tmp_path / "whole" / "final.pt", weights_only=True)
    killed = torch.load(tmp_path / "killed" / "final.pt", weights_only=True)
    assert all(torch.equal(whole[k], killed[k]) for k in whole)
    assert _names(tmp_path / "killed" / "checkpoints") == ["step_0000021.pt", "step_0000024.pt"]
    assert not list((tmp_path / "killed" / "checkpoints").glob(".*.tmp"))  # the half-written ones are gone


@pytest.mark.slow
def test_request_stop_on_rank_1_stops_both_ranks_after_the_same_step_and_resume_agrees(tmp_path):
    run_ranks(HERE / "train_request_stop.py", ["--out", str(tmp_path)], world_size=2, timeout=180)
    first = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    assert [r["global_step"] for r in first] == [3, 3] and [r["exit_code"] for r in first] == [0, 0]
    assert [r["stop_reason"] for r in first] == ["rank 1 had enough", "rank 1 had enough"]
    assert _names(tmp_path / "ckpt") == ["step_0000002.pt", "step_0000003.pt"]
    run_ranks(HERE / "train_request_stop.py", ["--out", str(tmp_path), "--resume"], world_size=2, timeout=180)
    second = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    assert [r["resumed_at"] for r in second] == [3, 3]
    assert [r["global_step"] for r in second] == [40, 40]


@pytest.mark.slow
def test_flush_logs_on_one_rank_fails_with_one_line_instead_of_hanging(tmp_path):
    results = run_ranks(HERE / "flush_alone.py", [], world_size=2, timeout=120,
                        extra_env={"DEVPLUG_COLLECTIVE_WAIT": "3"})
    assert "flush_logs() is a collective under 2 processes" in results[0].stdout
    assert "call it on every rank" in results[0].stdout


def _resume_outcome(*folders: Path) -> list[str]:
    results = run_ranks(HERE / "resume_refused.py", [str(f) for f in folders], world_size=2, timeout=120,
                        expect_code=3)
    assert all("Traceback" not in r.stderr for r in results), [r.stderr for r in results]
    lines = [[line for line in r.stdout.splitlines() if line.startswith("rank ")] for r in results]
    assert [len(found) for found in lines] == [1, 1], lines
    return [found[0].split(": ", 1)[1] for found in lines]


@pytest.mark.slow
def test_a_resume_rank_0_refuses_is_the_same_one_line_on_every_rank(tmp_path):
    """Rank 0 finds only damaged checkpoints: every rank raises its error, none is left waiting or crashes."""
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "step_0000005.pt").write_text("not a checkpoint")
    said = _resume_outcome(tmp_path)
    assert said[0] == said[1] and said[0].startswith("CheckpointError: no usable checkpoint to resume from"), said


@pytest.mark.slow
def test_a_checkpoint_another_rank_cannot_load_stops_every_rank(tmp_path):
    """Rank 1 cannot see the file rank 0 chose (a node without the shared disk): rank 0 does not go on alone to
    wait at the first collective; both raise a line naming what went wrong."""
    first, second = tmp_path / "node0", tmp_path / "node1"
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False)
    model = trainer.setup(torch.nn.Linear(3, 3), name="net")
    trainer.optimizer("sgd", model.parameters(), lr=0.1)
    trainer.save(first / "ckpt" / "step_0000005.pt")
    trainer.close()
    second.mkdir()
    said = _resume_outcome(first, second)
    assert said[1].startswith("CheckpointError: checkpoint 'ckpt/step_0000005.pt' does not exist"), said
    assert said[0].startswith("CheckpointError: rank 1 could not load ckpt/step_0000005.pt: "), said


@pytest.mark.parametrize("collective", [False, True])
def test_checkpoint_now_on_another_rank_writes_only_a_sharded_checkpoint(tmp_path, collective):
    # what checkpoint_now says of ranks other than 0: a checkpoint file is rank 0's alone (None elsewhere); a
    # sharded one is written by every rank (each its shards), and every rank gets its path
    import types
    import weakref

    from devplug.core.checkpoint.policy import RunCheckpoints
    from devplug.core.loop.run_checkpoints import CheckpointKeeper

    written: list[Path] = []
    state = types.SimpleNamespace(position=types.SimpleNamespace(global_step=4), registered={})
    keeper = CheckpointKeeper(state, RunCheckpoints(devplug.CheckpointPolicy(directory=tmp_path)),  # type: ignore[arg-type]
                              checkpoint_format=types.SimpleNamespace(collective=collective),  # type: ignore[arg-type]
                              combiner=None, is_main=False, nonfinite="raise", stepped=weakref.WeakSet(),
                              policy_save=written.append)
    path = keeper.save_by_policy()
    assert written == ([tmp_path / "step_0000004.pt"] if collective else [])
    assert path == (str(tmp_path / "step_0000004.pt") if collective else None)


def test_pruning_old_checkpoints_is_left_out_of_samples_per_second_as_their_writing_is(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from devplug.core.checkpoint import policy as policy_module
    from devplug.core.loop import run_checkpoints
    from devplug.core.loop import trainer as trainer_module
    from devplug.core.observe import metrics

    clock = Clock()
    for module in (metrics, trainer_module, run_checkpoints):
        monkeypatch.setattr(module, "time", SimpleNamespace(perf_counter=clock, monotonic=clock, time=clock))
    real_prune = policy_module.RunCheckpoints.prune

    def slow_prune(self, scores=None):
        clock.now += 100.0  # removing a large sharded folder takes long
        return real_prune(self, scores)

    monkeypatch.setattr(policy_module.RunCheckpoints, "prune", slow_prune)
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False, loggers=[], count_flops=False,
                              stop_signals=(), checkpoints=devplug.CheckpointPolicy(directory=tmp_path / "ckpt",
                                                                                    every_n_steps=2, keep_last=1))
    train_on_a_clock(trainer, clock)
    assert trainer.summary()["samples_per_sec"] == pytest.approx(40 / 10)
    trainer.close()
