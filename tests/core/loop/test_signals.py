"""SIGTERM, SIGUSR1 and Ctrl-C end a run at a step boundary: the author's code saves, and the exit code says why."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest
import torch
from dist_scripts.common import HERE, run_ranks
from paths import REPO
from torch.utils.data import TensorDataset

import devplug
from devplug.core.loop.signals import SIGNAL_CODE, StopRequest


def build(seed: int = 0, **options):
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False, seed=seed, **options)
    model = trainer.setup(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.1), torch.nn.Linear(8, 1)),
                          name="net")
    opt = trainer.optimizer("adam", model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(2)
    loader = trainer.dataloader(TensorDataset(torch.randn(24, 4, generator=g), torch.randn(24, 1, generator=g)), 4,
                                shuffle=True, num_workers=0)
    return trainer, model, opt, loader


def train(trainer, model, opt, loader, *, signal_at: int | None = None, signum: int = signal.SIGTERM) -> list[int]:
    steps = []
    for _epoch in trainer.epochs(3):
        for x, y in loader:
            trainer.backward(torch.nn.functional.mse_loss(model(x), y))
            trainer.step(opt)
            steps.append(trainer.global_step)
            if trainer.global_step == signal_at:
                os.kill(os.getpid(), signum)
    return steps


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGUSR1, 138), (signal.SIGINT, 130)])
def test_a_stop_signal_ends_the_run_after_the_current_step(signum, code):
    trainer, model, opt, loader = build()
    assert train(trainer, model, opt, loader, signal_at=8, signum=signum) == list(range(1, 9))
    assert (trainer.should_stop, trainer.exit_code) == (True, code)
    assert trainer.stop_signal == signal.Signals(signum).name
    assert signal.getsignal(signum) in (signal.SIG_DFL, signal.default_int_handler)  # restored after epochs()


def test_a_run_stopped_by_sigterm_resumes_to_the_uninterrupted_result(tmp_path):
    full = build()
    train(*full)
    first = build()
    train(*first, signal_at=8)  # mid-epoch: 6 steps per epoch
    path = first[0].save(tmp_path / "stopped.pt")
    resumed = build(seed=9)
    resumed[0].load(path)
    assert train(*resumed) == list(range(9, 19))
    for a, b in zip(full[1].state_dict().values(), resumed[1].state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_signals_outside_epochs_keep_their_meaning_and_can_be_switched_off():
    trainer, *_ = build(stop_signals=())
    assert trainer._stop.numbers == []
    before = signal.getsignal(signal.SIGTERM)
    for _epoch in trainer.epochs(1):
        assert signal.getsignal(signal.SIGTERM) is before
        break
    with pytest.raises(devplug.ConfigError, match="'SIGNOPE', which is not a signal"):
        build(stop_signals=("SIGNOPE",))


def test_a_second_sigterm_stops_at_once(tmp_path):
    script = tmp_path / "twice.py"
    script.write_text(textwrap.dedent("""
        import os, signal, torch, devplug
        trainer = devplug.Trainer(device="cpu", progress=False)
        loader = trainer.dataloader(torch.utils.data.TensorDataset(torch.zeros(8, 1)), 1, num_workers=0)
        for _ in trainer.epochs(1):
            for _batch in loader:
                os.kill(os.getpid(), signal.SIGTERM)
                os.kill(os.getpid(), signal.SIGTERM)
                print("still running")
    """))
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == -signal.SIGTERM
    assert "still running" not in result.stdout and "SIGTERM received" in result.stderr


class OtherRankSignalled:
    """Stands in for the cross-rank combiner when another rank received SIGTERM."""

    def max(self, value: int) -> int:
        return max(value, SIGNAL_CODE + signal.SIGTERM)

    def broadcast(self, value: object, source: int) -> object:
        return value


def test_a_rank_stopped_by_another_takes_its_own_late_signal_as_its_first(capsys):
    """A scheduler signals every task a moment apart: a rank may agree to stop before its own copy arrives."""
    calls = []
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: calls.append(signum))  # "stop at once"
    try:
        inside = StopRequest(["SIGUSR1"], OtherRankSignalled())
        with inside.handling():
            assert inside.should_stop() and inside.exit_code == 143
            os.kill(os.getpid(), signal.SIGUSR1)  # this rank's own copy, before epochs() ended
        assert calls == [] and inside.exit_code == 138
        after = StopRequest(["SIGUSR1"], OtherRankSignalled())
        with after.handling():
            assert after.should_stop()
        os.kill(os.getpid(), signal.SIGUSR1)  # ... or after it ended, while the rank saves
        assert calls == [] and after.exit_code == 138
        os.kill(os.getpid(), signal.SIGUSR1)  # a second one keeps its usual meaning
        assert calls == [signal.SIGUSR1]
        assert "already stopping" in capsys.readouterr().err
    finally:
        signal.signal(signal.SIGUSR1, previous)


def test_a_signal_of_another_kind_while_stopping_is_noted_and_the_same_kind_again_stops_at_once(capsys):
    """SLURM's --signal sends SIGUSR1 before the time limit, then SIGTERM at it: the save under way goes on."""
    calls: list[int] = []
    previous = {number: signal.signal(number, lambda signum, frame: calls.append(signum))  # "stop at once"
                for number in (signal.SIGUSR1, signal.SIGTERM)}
    try:
        stop = StopRequest(["SIGUSR1", "SIGTERM"])
        with stop.handling():
            os.kill(os.getpid(), signal.SIGUSR1)
            os.kill(os.getpid(), signal.SIGTERM)  # another kind: the run is already stopping
            assert calls == [] and stop.exit_code == 138 and stop.should_stop()
            os.kill(os.getpid(), signal.SIGTERM)  # the same kind again: its usual meaning, at once
            assert calls == [signal.SIGTERM]
        assert "SIGTERM received: already stopping" in capsys.readouterr().err
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


@pytest.mark.slow
def test_under_two_ranks_every_rank_stops_at_the_same_step_and_rank0_saves(tmp_path):
    run_ranks(HERE / "train_stop.py", ["--out", str(tmp_path)], world_size=2, timeout=180, expect_code=143)
    results = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    assert [r["global_step"] for r in results] == [3, 3]  # rank 1 never got the signal
    assert [r["exit_code"] for r in results] == [143, 143]
    assert results[0]["saved"] and results[1]["saved"] is None
    assert torch.load(tmp_path / "stopped.pt", weights_only=True)["global_step"] == 3


@pytest.mark.parametrize("how", ["SIGTERM", "request_stop"])
def test_a_stop_during_the_evaluation_after_an_epoch_ends_the_run_before_the_next_epoch(how):
    # the end of an epoch is a step boundary: the loop does not begin another epoch (an empty training pass,
    # then a whole evaluation the pre-emption's grace period may not have room for; early stopping decided
    # by that evaluation likewise)
    trainer, model, opt, loader = build()
    evaluated = []
    for epoch in trainer.epochs(3):
        for x, y in loader:
            trainer.backward(torch.nn.functional.mse_loss(model(x), y))
            trainer.step(opt)
        evaluated.append((epoch, trainer.global_step))
        if epoch == 0 and how == "SIGTERM":
            os.kill(os.getpid(), signal.SIGTERM)  # arrives while the evaluation of epoch 0 runs
        elif epoch == 0:
            trainer.request_stop("early stopping")
    assert evaluated == [(0, 6)]
    assert trainer.global_step == 6 and trainer.epoch == 1  # epoch 0 done: a resume begins epoch 1
    assert (trainer.stop_signal, trainer.exit_code) == (("SIGTERM", 143) if how == "SIGTERM" else (None, 0))
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # Ctrl-C is Ctrl-C again


def test_after_a_request_to_stop_signals_keep_their_usual_meaning():
    # a request is not a signal: no copy of one is on its way, so none is taken for it (a Ctrl-C or SIGTERM
    # after an early stop acts at once, as outside epochs())
    trainer, model, opt, loader = build()
    for _ in trainer.epochs(3):
        for x, y in loader:
            trainer.backward(torch.nn.functional.mse_loss(model(x), y))
            trainer.step(opt)
            if trainer.global_step == 2:
                trainer.request_stop("early stopping")
    assert trainer.global_step == 2 and trainer.exit_code == 0
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)
