"""`devplug.ThroughputMeter`: steady-state units per second, the first step and every pause left out."""

from __future__ import annotations

import time

import pytest
import torch
from toys import Clock

import devplug
from devplug.core.observe import metrics


@pytest.fixture
def metrics_clock(monkeypatch) -> Clock:
    """A clock the test moves by hand, read by devplug's throughput meters as their ``time.perf_counter``."""
    from types import SimpleNamespace

    clock = Clock()
    monkeypatch.setattr(metrics, "time", SimpleNamespace(perf_counter=clock))
    return clock



def test_the_rate_leaves_out_the_first_step_and_every_pause():
    clock = Clock()
    meter = devplug.ThroughputMeter(clock=clock)
    clock.now += 5.0  # the first step: warm-up, compilation
    meter.add(10)
    meter.first_step_done()
    for _ in range(4):  # four steps of 10 units, 1 s each
        clock.now += 1.0
        meter.add(10)
    with meter.paused():  # an evaluation of 30 s
        clock.now += 30.0
    clock.now += 1.0
    meter.add(10)
    meter.stop()
    assert meter.total == 60 and meter.steady == 50
    assert meter.paused_seconds == pytest.approx(30.0)
    assert meter.per_second == pytest.approx(50 / 5.0)  # not 50 / 35
    assert meter.wall_seconds == pytest.approx(40.0)


def test_a_pause_before_the_steady_state_counts_only_from_its_start():
    clock = Clock()
    meter = devplug.ThroughputMeter(clock=clock)
    meter.pause()  # an evaluation before the first step
    clock.now += 10.0
    meter.resume()
    meter.add(4)
    meter.first_step_done()
    meter.pause()
    clock.now += 3.0
    meter.first_step_done()  # a second call changes nothing
    meter.stop()  # ends the open pause
    assert meter.paused_seconds == pytest.approx(3.0)


def test_a_run_of_one_step_reports_its_whole_rate_and_an_empty_one_zero():
    clock = Clock()
    one = devplug.ThroughputMeter(clock=clock)
    clock.now += 2.0
    one.add(8)
    one.first_step_done()
    one.stop()
    assert one.per_second == pytest.approx(4.0)
    assert devplug.ThroughputMeter(clock=clock).per_second == 0.0


def test_the_trainers_own_meter_leaves_a_paused_evaluation_out_of_samples_per_second(metrics_clock):
    clock = metrics_clock
    meter = metrics.Throughput()
    meter.add(8)  # the first batch starts the clock
    clock.now += 1.0
    meter.add(8)
    with meter.paused():  # a 9 s evaluation between two training batches
        clock.now += 9.0
    clock.now += 1.0
    meter.add(8)
    assert meter.lap() == pytest.approx(24 / 2.0)  # not 24 / 11
    assert meter.seconds_total == pytest.approx(2.0)


def test_time_measured_elsewhere_is_left_out_of_the_steady_state_only():
    clock = Clock()
    meter = devplug.ThroughputMeter(clock=clock)
    meter.exclude(7.0)  # before the first step: nothing to leave out
    clock.now += 2.0
    meter.add(10)
    meter.first_step_done()
    clock.now += 12.0  # two steps of 1 s and a 10 s checkpoint write
    meter.add(20)
    meter.exclude(10.0)
    meter.stop()
    assert meter.per_second == pytest.approx(20 / 2.0)  # not 20 / 12


def test_the_checkpoint_policys_saves_are_not_training_time(tmp_path):
    class SlowSavingTrainer(devplug.Trainer):
        def save(self, path, **kwargs):
            time.sleep(0.4)  # a large model's checkpoint
            return super().save(path, **kwargs)

    trainer = SlowSavingTrainer(device="cpu", progress=False, log_every=1,
                                checkpoints=devplug.CheckpointPolicy(directory=tmp_path, every_n_steps=2))
    model = trainer.setup(torch.nn.Linear(4, 1))
    optimizer = trainer.optimizer("sgd", model.parameters(), lr=0.1)
    loader = trainer.dataloader(torch.utils.data.TensorDataset(torch.randn(48, 4)), batch_size=8)
    began = time.perf_counter()
    for _ in trainer.epochs(1):
        for (x,) in loader:
            trainer.backward(model(x).square().mean())
            trainer.step(optimizer)
            trainer.log(loss=0.0)
    wall = time.perf_counter() - began
    saves = len(list(tmp_path.glob("step_*.pt")))
    assert saves == 3  # steps 2, 4 and 6
    assert trainer.checkpoint_seconds >= 0.4 * saves
    # the Trainer's clock runs from the first batch; without the saves it is a fraction of the wall time
    assert trainer.throughput.seconds_total < wall - 0.4 * (saves - 1)


def _timed_loop(clock: Clock, *, steps: int, log_at) -> devplug.Trainer:
    """``steps`` steps of 4 samples, each taking 1 s on a clock the test moves; ``log(loss=...)`` where ``log_at``."""
    trainer = devplug.Trainer(device="cpu", progress=False, loggers=[], stop_signals=(), count_flops=False,
                              log_every=5)
    model = trainer.setup(torch.nn.Linear(4, 1))
    optimizer = trainer.optimizer("sgd", model.parameters(), lr=0.1)
    loader = trainer.dataloader(torch.utils.data.TensorDataset(torch.randn(4 * steps, 4)), batch_size=4,
                                num_workers=0)
    for _ in trainer.epochs(1):
        for (x,) in loader:
            clock.now += 1.0  # the step's work
            trainer.backward(model(x).square().mean())
            trainer.step(optimizer)
            if log_at(trainer.global_step):
                trainer.log(loss=0.0)
    return trainer


@pytest.mark.parametrize(("name", "log_at"), [("every step", lambda step: True),
                                              ("never", lambda step: False),
                                              ("only early on", lambda step: step <= 5)])
def test_the_summarys_rate_covers_every_step_logged_or_not(metrics_clock, name, log_at):
    # the clock starts at the first batch: 15 steps of 4 samples in 15 s; the rate counts the steps after
    # the last log point too (they were counted, not timed), and a loop that never logs still has one
    trainer = _timed_loop(metrics_clock, steps=15, log_at=log_at)
    assert trainer.summary()["samples_per_sec"] == pytest.approx(60 / 15), name


def test_a_log_point_inside_a_paused_evaluation_leaves_the_evaluation_out_of_both_laps(metrics_clock):
    # a loop that logs its loss before trainer.step() has values pending when the evaluation's own
    # trainer.log(val_loss=...) lands on a log step: the log point (a lap) then falls inside the pause
    clock = metrics_clock
    meter = metrics.Throughput()
    meter.add(8)  # the first batch starts the clock
    clock.now += 1.0
    meter.add(8)
    clock.now += 1.0
    with meter.paused():  # a 10 s evaluation, with a log point 4 s into it
        clock.now += 4.0
        assert meter.lap() == pytest.approx(16 / 2.0)  # not 16 / 6
        clock.now += 6.0
    clock.now += 1.0
    meter.add(8)
    clock.now += 1.0
    meter.add(8)
    assert meter.lap() == pytest.approx(16 / 2.0)  # not 16 / 1e-9 (the pause taken off twice)
    assert meter.seconds_total == pytest.approx(4.0)
    assert meter.mean_rate == pytest.approx(32 / 4.0)


def test_time_left_out_inside_a_paused_evaluation_is_left_out_once(metrics_clock):
    # trainer.checkpoint_now() inside `with trainer.throughput.paused():` takes its save out of the clock, and
    # the pause takes out its whole time, the save included
    clock = metrics_clock
    meter = metrics.Throughput()
    meter.add(8)
    clock.now += 1.0
    meter.add(8)
    with meter.paused():  # a 5 s evaluation, then a 3 s save
        clock.now += 8.0
        meter.exclude(3.0)
    clock.now += 1.0
    meter.add(8)
    assert meter.lap() == pytest.approx(24 / 2.0)  # not 24 / 1e-9
    assert meter.seconds_total == pytest.approx(2.0)


def test_time_between_chunks_of_training_is_not_training_time(metrics_clock):
    # training in chunks of max_steps (docs/trainer.md), with 100 s of the author's own work between chunks
    clock = metrics_clock
    trainer = devplug.Trainer(device="cpu", progress=False, loggers=[], stop_signals=(), count_flops=False,
                              log_every=4)
    model = trainer.setup(torch.nn.Linear(4, 1))
    optimizer = trainer.optimizer("sgd", model.parameters(), lr=0.1)
    loader = trainer.dataloader(torch.utils.data.TensorDataset(torch.randn(4 * 12, 4)), batch_size=4,
                                num_workers=0)
    rates = []
    for chunk in (4, 8, 12):
        for _ in trainer.epochs(1, max_steps=chunk):
            for (x,) in loader:
                clock.now += 1.0  # the step's work
                trainer.backward(model(x).square().mean())
                trainer.step(optimizer)
                values = trainer.log(loss=0.0)
                if values is not None:
                    rates.append(values["samples_per_sec"])
        clock.now += 100.0  # an evaluation, samples written, a save of the author's own: not training
    assert trainer.global_step == 12
    assert rates == [pytest.approx(16 / 4.0)] * 3
    assert trainer.summary()["samples_per_sec"] == pytest.approx(48 / 12.0)


def test_a_pause_inside_a_pause_ends_with_the_outer_one():
    clock = Clock()
    meter = devplug.ThroughputMeter(clock=clock)
    meter.add(10)
    meter.first_step_done()
    with meter.paused():  # the author's evaluation block ...
        clock.now += 4.0
        with meter.paused():  # ... calls a function that pauses the meter itself
            clock.now += 6.0
        clock.now += 5.0  # samples written after the evaluation, still inside the outer block
    clock.now += 2.0
    meter.add(20)
    meter.stop()
    assert meter.paused_seconds == pytest.approx(15.0)
    assert meter.per_second == pytest.approx(20 / 2.0)
