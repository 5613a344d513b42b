"""Loggers are plugins: TensorBoard, CSV, JSON Lines, MLflow and an entry-point plugin get the same log points."""

from __future__ import annotations

import csv
import json
import sys

import pytest
import torch
from toys import SyncCounter, make_data, make_model, train_toy

import devplug
from devplug.core.observe.tensorboard import board_tag
from devplug.core.registry.manager import create_plugin_manager

LOGGER_PLUGIN = """
import json, os
import devplug

DEVPLUG_CONTRACT = "1.2"


@devplug.hookimpl
def devplug_log(point):
    path = os.environ["TOY_LOGGER_OUT"]
    with open(path, "a") as f:
        f.write(json.dumps({"step": point.step, "values": dict(point.values), "images": sorted(point.images),
                            "final": point.final}) + "\\n")
"""


def _train(trainer: devplug.Trainer, steps: int = 6) -> None:
    train_toy(trainer, steps=steps)
    trainer.log_images("samples", torch.zeros(4, 3, 8, 8))
    trainer.close()


def _tensorboard(log_dir) -> dict[tuple[int, str], float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir))
    events.Reload()
    return {(e.step, tag): e.value for tag in events.Tags()["scalars"] for e in events.Scalars(tag)}


def _csv(path) -> dict[tuple[int, str], float]:
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    return {(int(r["step"]), r["name"]): float(r["value"]) for r in rows}


def _jsonl(path) -> dict[tuple[int, str], float]:
    out = {}
    for line in open(path).read().splitlines():
        record = json.loads(line)
        if "step" not in record:  # a hyperparameters record
            continue
        step = record.pop("step")
        out.update({(step, name): value for name, value in record.items()})
    return out


def _mlflow(uri: str, run_id: str) -> dict[tuple[int, str], float]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    assert client.get_run(run_id).info.status == "FINISHED"  # the final point ended the run
    return {(m.step, m.key): m.value for key in client.get_run(run_id).data.metrics
            for m in client.get_metric_history(run_id, key)}


def test_csv_jsonl_and_mlflow_get_what_tensorboard_gets_at_the_same_steps(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    log_dir = tmp_path / "run"
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False, log_every=2, log_dir=str(log_dir),
                              loggers=["tensorboard", "csv", "jsonl", "mlflow"])
    mlflow_logger = trainer._reporter.loggers[3]
    run_id = mlflow_logger.run_id
    _train(trainer)
    board = _tensorboard(log_dir)
    assert {step for step, _ in board} == {2, 4, 6}
    assert {name for _, name in board} >= {"train/loss", "perf/samples_per_sec"}
    assert any(n.startswith("lr/") for _, n in board)
    for seen in (_csv(log_dir / "metrics.csv"), _jsonl(log_dir / "metrics.jsonl"),
                 _mlflow(mlflow_logger.tracking_uri, run_id)):
        seen = {(step, board_tag(name)): value for (step, name), value in seen.items()}  # names as logged
        assert seen.keys() == board.keys()
        for key, value in board.items():  # TensorBoard stores float32
            assert seen[key] == pytest.approx(value, rel=1e-6), key


def test_a_logger_plugin_from_an_entry_point_gets_every_point(installed_logger, tmp_path, monkeypatch):
    out = tmp_path / "toy.jsonl"
    monkeypatch.setenv("TOY_LOGGER_OUT", str(out))
    log_dir = tmp_path / "run"
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False, log_every=3, log_dir=str(log_dir),
                              loggers=["csv"], plugin_manager=create_plugin_manager())
    _train(trainer)
    points = [json.loads(line) for line in out.read_text().splitlines()]
    values = [p for p in points if p["values"]]
    assert [p["step"] for p in values] == [3, 6]
    assert {(p["step"], k): v for p in values for k, v in p["values"].items()} == _csv(log_dir / "metrics.csv")
    assert [p["images"] for p in points if p["images"]] == [["samples"]]
    assert points[-1]["final"] and sum(p["final"] for p in points) == 1


@pytest.fixture
def installed_logger(tmp_path, monkeypatch, install_distribution):
    target = install_distribution(tmp_path / "site-toy-logger", "toy-logger", LOGGER_PLUGIN,
                                  {"toylogger": "toy_logger"})
    monkeypatch.syspath_prepend(str(target))
    for mod in [m for m in sys.modules if m.startswith("toy_logger")]:
        monkeypatch.delitem(sys.modules, mod)


class ListLogger:
    """A logger object given to one Trainer."""

    def __init__(self) -> None:
        self.points: list[devplug.LogPoint] = []

    def devplug_log(self, point: devplug.LogPoint) -> None:
        self.points.append(point)


def test_no_host_sync_between_log_points_with_three_loggers(tmp_path, monkeypatch):
    mine = ListLogger()
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False, log_every=4, log_dir=str(tmp_path),
                              loggers=["csv", "jsonl", mine])
    model = trainer.setup(make_model())
    opt = trainer.optimizer("adamw", model.parameters(), lr=1e-3)
    loader = trainer.dataloader(make_data(64), batch_size=4, num_workers=0)
    counter = SyncCounter(monkeypatch)
    reads = []
    for _ in trainer.epochs(1, max_steps=12):
        for x, y in loader:
            before = counter.count
            with trainer.autocast():
                loss = torch.nn.functional.mse_loss(model(x), y)
            trainer.backward(loss)
            trainer.step(opt)
            trainer.log(loss=loss)
            reads.append((trainer.global_step, counter.count - before))
    assert [step for step, n in reads if n] == [4, 8, 12]
    assert [p.step for p in mine.points if p.values] == [4, 8, 12]
    assert len(_csv(tmp_path / "metrics.csv")) == len(_jsonl(tmp_path / "metrics.jsonl")) > 0


def test_loggers_write_on_the_main_process_only(tmp_path):
    from devplug.core.observe.reporter import Reporter

    mine, published = ListLogger(), []
    reporter = Reporter(log_dir=str(tmp_path), progress=False, nonfinite="raise", is_main=False, world_size=2,
                        loggers=[mine], publish=published.append)
    reporter.metrics.add("loss", torch.tensor(1.0))
    reporter.throughput.add(4)
    reporter.flush(1, synchronize=lambda: None, learning_rates={})
    reporter.close(1)
    assert mine.points == [] and published == []


@pytest.mark.parametrize(("options", "message"), [
    ({"loggers": ["nope"], "log_dir": "x"}, "unknown logger 'nope'; use one of tensorboard, csv, jsonl, mlflow"),
    ({"loggers": [object()]}, "has no devplug_log(point) method"),
    ({"loggers": ["csv"]}, "loggers csv write into log_dir: set log_dir too"),
])
def test_bad_loggers_are_one_clear_line(options, message):
    with pytest.raises(devplug.ConfigError, match=r"^invalid Trainer configuration: ") as info:
        devplug.Trainer(device="cpu", progress=False, **options)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_one_logger_needs_no_list():
    mine = ListLogger()
    trainer = devplug.Trainer(device="cpu", progress=False, loggers=mine)
    assert trainer._reporter.loggers == [mine]


def test_without_log_dir_the_default_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    trainer = devplug.Trainer(device="cpu", progress=False, log_every=1)
    assert trainer._reporter.loggers == [] and trainer.writer is None
    _train(trainer, steps=2)
    assert list(tmp_path.iterdir()) == []


def test_mlflow_logger_that_cannot_start_is_one_clear_line(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    with pytest.raises(devplug.ConfigError, match="the mlflow logger cannot start a run") as info:
        devplug.Trainer(device="cpu", progress=False, log_dir=str(tmp_path), loggers=["mlflow"])
    assert "\n" not in str(info.value)


def test_without_tensorboard_the_default_logger_is_csv_with_a_one_line_note(tmp_path, monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # hides it: import tensorboard raises ImportError
    log_dir = tmp_path / "run"
    with caplog.at_level("WARNING", logger="devplug"):
        trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False, log_every=2,
                                  log_dir=str(log_dir))
    notes = [r.getMessage() for r in caplog.records if "tensorboard" in r.getMessage()]
    assert notes == [f"tensorboard is not installed: logging to {log_dir / 'metrics.csv'} instead "
                     "(pip install 'devplug[tensorboard]' for TensorBoard)"]
    _train(trainer)
    assert {step for step, _ in _csv(log_dir / "metrics.csv")} == {2, 4, 6}
    assert not list(log_dir.glob("events.out.tfevents.*"))


def test_tensorboard_asked_for_by_name_is_not_replaced(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard", None)
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False, log_dir=str(tmp_path),
                              loggers=["tensorboard"])
    assert [type(logger).__name__ for logger in trainer._reporter.loggers] == ["TensorBoardLogger"]
