"""A profiler window: torch.profiler over chosen steps, with the step's regions and the data wait in the trace."""

from __future__ import annotations

import collections
import json

import pytest
import torch
from toys import Clock, make_data, make_model, train_on_a_clock, train_toy

import devplug
from devplug.core.observe.profiling import parse_window


def _train(trainer: devplug.Trainer, steps: int) -> None:
    train_toy(trainer, steps=steps, epochs=2)


def _regions(path) -> collections.Counter:
    events = json.loads(path.read_text())["traceEvents"]
    return collections.Counter(e["name"] for e in events if e.get("cat") == "user_annotation")


def test_a_window_on_cpu_writes_a_trace_with_the_regions_and_the_data_wait(tmp_path):
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False, log_every=4, log_dir=str(tmp_path),
                              profile="steps 3-5")
    _train(trainer, steps=9)
    traces = sorted((tmp_path / "profiler").glob("rank0.*.pt.trace.json"))
    assert [str(t) for t in traces] == trainer.profiler.traces
    assert len(traces) == 1
    regions = _regions(traces[0])
    assert {name: regions[name] for name in ("data_wait", "forward", "backward", "optimizer_step")} == {
        "data_wait": 3, "forward": 3, "backward": 3, "optimizer_step": 3}
    assert not trainer.profiler.active


def test_a_window_the_run_ends_inside_is_written_when_the_loop_ends(tmp_path):
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False, log_dir=str(tmp_path),
                              profile="steps 7-100")
    _train(trainer, steps=8)
    (trace,) = (tmp_path / "profiler").glob("*.pt.trace.json")
    assert _regions(trace)["optimizer_step"] == 2


def test_a_window_before_the_step_a_resumed_run_starts_at_is_said_once(tmp_path, caplog):
    def run(trainer: devplug.Trainer, steps: int, resume: str | None = None) -> None:
        model = trainer.setup(make_model())
        opt = trainer.optimizer("sgd", model.parameters(), lr=0.01)
        loader = trainer.dataloader(make_data(64), batch_size=4, num_workers=0)
        if resume is not None:
            trainer.load(resume)
        for _ in trainer.epochs(1, max_steps=steps):
            for x, y in loader:
                trainer.backward(torch.nn.functional.mse_loss(model(x), y))
                trainer.step(opt)

    first = devplug.Trainer(device="cpu", precision="32-true", progress=False, log_dir=str(tmp_path / "a"))
    run(first, steps=6)
    path = first.save(tmp_path / "ck.pt")
    again = devplug.Trainer(device="cpu", precision="32-true", progress=False, log_dir=str(tmp_path / "b"),
                            profile="steps 3-5")
    with caplog.at_level("WARNING", logger="devplug"):
        run(again, steps=10, resume=path)
    warnings = [r.getMessage() for r in caplog.records if "profile" in r.getMessage()]
    assert warnings == ["profile window steps 3-5 lies before step 7, where this run starts: no trace is written; "
                        "name later steps"]
    assert again.profiler.traces == []


def test_without_a_window_nothing_is_profiled(tmp_path):
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False, log_dir=str(tmp_path))
    _train(trainer, steps=3)
    assert not (tmp_path / "profiler").exists() and trainer.profiler.traces == []


@pytest.mark.parametrize(("text", "window"), [("steps 10-15", (10, 15)), ("10-15", (10, 15)), ("step 7", (7, 7)),
                                              (" steps 2 - 3 ", (2, 3))])
def test_window_syntax(text, window):
    assert parse_window(text) == window


@pytest.mark.parametrize(("options", "message"), [
    ({"profile": "10 to 15", "log_dir": "x"}, "profile must look like 'steps 10-15'"),
    ({"profile": "steps 5-2", "log_dir": "x"}, "must name steps 1 <= first <= last"),
    ({"profile": "steps 1-2"}, "profile writes its trace under log_dir/profiler: set log_dir too"),
])
def test_a_bad_window_is_one_clear_line(options, message):
    with pytest.raises(devplug.ConfigError) as info:
        devplug.Trainer(device="cpu", progress=False, **options)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_the_example_passes_profile_and_price_through_to_the_trainer(tmp_path):
    from dcgan_runs import run  # the DCGAN example at its tiny test size

    out = tmp_path / "run"
    assert run(["--data", "fake", "--steps", "4", "--log-every", "2", "--out", str(out), "--profile", "steps 2-3",
                "--price-per-hour", "3.06"]) == 0
    (trace,) = (out / "tensorboard" / "profiler").glob("rank0.*.pt.trace.json")
    assert {"data_wait", "forward", "backward", "optimizer_step"} <= set(_regions(trace))
    scalars = (out / "tensorboard").glob("events.out.tfevents.*")
    assert list(scalars)


def test_a_bad_window_from_the_example_is_one_line(tmp_path, capsys):
    from dcgan_runs import run

    try:
        status = run(["--data", "fake", "--steps", "2", "--out", str(tmp_path / "run"), "--profile", "soon"])
    except SystemExit as exc:  # a flag's own check exits through the parser, status 2
        status = exc.code
    assert status == 2
    err = capsys.readouterr().err
    assert "--profile" in err and "must look like 'steps 10-15'" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_writing_the_trace_is_left_out_of_samples_per_second(tmp_path, monkeypatch):
    # the trace is written when the window closes: bookkeeping like a checkpoint, not training time
    from types import SimpleNamespace

    import torch

    from devplug.core.observe import metrics, profiling

    clock = Clock()
    monkeypatch.setattr(metrics, "time", SimpleNamespace(perf_counter=clock))
    monkeypatch.setattr(profiling, "time", SimpleNamespace(perf_counter=clock, time_ns=profiling.time.time_ns))
    real_export = torch.profiler.profile.export_chrome_trace

    def slow_export(self, path):
        clock.now += 100.0  # a large trace takes long to write
        return real_export(self, path)

    monkeypatch.setattr(torch.profiler.profile, "export_chrome_trace", slow_export)
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False, loggers=[], log_dir=str(tmp_path),
                              profile="steps 2-3", count_flops=False, stop_signals=())
    train_on_a_clock(trainer, clock)
    assert len(trainer.profiler.traces) == 1
    assert trainer.summary()["samples_per_sec"] == pytest.approx(40 / 10)


def test_a_trace_that_cannot_be_written_is_said_once_and_training_goes_on(tmp_path, caplog):
    # a full disk or a folder that takes no files: the loggers go on without their output, and so does the profiler
    (tmp_path / "profiler").write_text("a file where the trace folder should be")
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False, log_every=4, log_dir=str(tmp_path),
                              profile="steps 2-3")
    with caplog.at_level("WARNING", logger="devplug"):
        _train(trainer, steps=6)
    assert trainer.global_step == 6 and trainer.profiler.traces == [] and not trainer.profiler.active
    lines = [r.getMessage() for r in caplog.records if "profiler trace" in r.getMessage()]
    assert len(lines) == 1 and str(tmp_path / "profiler") in lines[0], lines
    trainer.close()
