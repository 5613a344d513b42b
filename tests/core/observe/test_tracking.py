"""Tracking that shows the whole run: no zero throughput at epoch ends, hyperparameters in every logger, MLflow
params, tags and artifacts, a W&B logger, grouped TensorBoard tags."""

from __future__ import annotations

import csv
import glob
import json
import struct

import pytest
import torch
from test_loggers import _csv, _jsonl, _tensorboard
from toys import make_data, make_model, train_toy

import devplug

HPARAMS = {"lr": 0.01, "model": {"width": 16, "act": "tanh"}, "layers": [16, 1], "amp": False, "note": None}
FLAT = {"lr": 0.01, "model.width": 16, "model.act": "tanh", "layers": "[16, 1]", "amp": False, "note": "null"}
PERF = ("samples_per_sec", "data_wait", "mfu", "flops_per_sample", "samples_per_dollar")


def _train_with_eval(trainer: devplug.Trainer, *, epochs: int = 2) -> None:
    """16 steps an epoch, a log point every 4: each epoch ends at a log point, then logs its evaluation."""
    model = trainer.setup(make_model())
    opt = trainer.optimizer("sgd", model.parameters(), lr=0.01)
    loader = trainer.dataloader(make_data(64), batch_size=4, num_workers=0)
    for _ in trainer.epochs(epochs):
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            trainer.backward(loss)
            trainer.step(opt)
            trainer.log(loss=loss)
        with torch.no_grad():
            trainer.log(val_loss=torch.nn.functional.mse_loss(model(x), y))


# ---- throughput at epoch ends ---------------------------------------------------------------------------
def test_an_epoch_end_point_writes_no_zero_throughput_or_mfu(tmp_path):
    log_dir = tmp_path / "run"
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False, log_every=4, log_dir=str(log_dir),
                              loggers=["tensorboard", "csv", "jsonl"], price_per_hour=1.0)
    _train_with_eval(trainer)
    trainer.close()
    csv_values, jsonl_values = _csv(log_dir / "metrics.csv"), _jsonl(log_dir / "metrics.jsonl")
    board = {(step, name.split("/", 1)[1]): v for (step, name), v in _tensorboard(log_dir).items()
             if name.startswith("perf/")}
    for seen in (csv_values, jsonl_values, board):
        rates = {key: value for key, value in seen.items() if key[1] in ("samples_per_sec", "mfu")}
        assert rates and all(value > 0 for value in rates.values()), rates
        assert {step for step, name in rates if name == "samples_per_sec"} == set(range(4, 33, 4))
    # the evaluation points carry the evaluation alone
    assert {name for (step, name) in csv_values if step == 16} >= {"val_loss", "loss", "samples_per_sec"}
    lines = [json.loads(line) for line in (log_dir / "metrics.jsonl").read_text().splitlines()]
    assert [line for line in lines if "val_loss" in line] == [{"step": 16, "val_loss": pytest.approx(
        csv_values[(16, "val_loss")])}, {"step": 32, "val_loss": pytest.approx(csv_values[(32, "val_loss")])}]


def test_a_flush_with_no_step_since_the_last_point_adds_no_rates():
    from devplug.core.observe.reporter import Reporter

    reporter = Reporter(log_dir=None, progress=False, nonfinite="raise", is_main=True, world_size=1)
    reporter.metrics.add("loss", 1.0)
    reporter.throughput.add(4)
    reporter.throughput.add(4, 0.01)
    first = reporter.flush(2, synchronize=lambda: None, learning_rates={"net": 0.1})
    assert first is not None and {"samples_per_sec", "data_wait", "lr/net"} <= set(first)
    reporter.metrics.add("val_loss", 2.0)
    assert reporter.flush(2, synchronize=lambda: None, learning_rates={"net": 0.1}) == {"val_loss": 2.0}


# ---- hyperparameters ----------------------------------------------------------------------------------
def test_flatten_hparams_keeps_plain_values_and_flattens_the_rest():
    from devplug.core.observe.hparams import flatten_hparams

    assert flatten_hparams(HPARAMS) == FLAT
    assert flatten_hparams({"t": torch.tensor(3), "inf": float("inf")}) == {"t": 3, "inf": "inf"}
    with pytest.raises(TypeError, match="must be a mapping"):
        flatten_hparams([("lr", 1)])


def _hparams_in_tensorboard(log_dir) -> tuple[dict, bool]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import metadata

    events = EventAccumulator(str(log_dir))
    events.Reload()
    content = events.PluginTagToContent(metadata.PLUGIN_NAME)
    start = metadata.parse_session_start_info_plugin_data(content[metadata.SESSION_START_INFO_TAG])
    values = {}
    for name, value in start.hparams.items():
        kind = value.WhichOneof("kind")
        values[name] = getattr(value, kind)
    assert metadata.EXPERIMENT_TAG not in content  # metrics come from the run's own scalars
    return values, metadata.SESSION_END_INFO_TAG in content


def test_hparams_reach_tensorboard_csv_jsonl_and_mlflow(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    log_dir = tmp_path / "run"
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False, log_every=2, log_dir=str(log_dir),
                              loggers=["tensorboard", "csv", "jsonl", "mlflow"], hparams=HPARAMS)
    run_id = trainer._reporter.loggers[3].run_id
    trainer.log_hparams({"batch_size": 4})
    train_toy(trainer, steps=4)
    trainer.close()
    every = {**FLAT, "batch_size": 4}

    lines = [json.loads(line) for line in (log_dir / "metrics.jsonl").read_text().splitlines()]
    assert lines[:2] == [{"hparams": FLAT}, {"hparams": {"batch_size": 4}}]
    assert all("step" in line for line in lines[2:])

    assert json.loads((log_dir / "metrics.hparams.json").read_text()) == every
    with open(log_dir / "metrics.csv", newline="") as f:
        assert next(csv.reader(f)) == ["step", "name", "value"]  # a plain CSV: the header comes first

    board, ended = _hparams_in_tensorboard(log_dir)
    assert board == {k: float(v) if isinstance(v, int) and not isinstance(v, bool) else v for k, v in every.items()}
    assert ended

    client = MlflowClient(tracking_uri=trainer._reporter.loggers[3].tracking_uri)
    assert client.get_run(run_id).data.params == {k: str(v) for k, v in every.items()}


def test_hparams_must_be_a_mapping():
    with pytest.raises(devplug.ConfigError, match=r"^invalid Trainer configuration: .*'hparams' must be"):
        devplug.Trainer(device="cpu", progress=False, hparams=[1, 2])


# ---- MLflow: params, tags, artifacts ----------------------------------------------------------------------
def test_mlflow_gets_tags_image_files_and_the_summary(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    log_dir = tmp_path / "run"
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False, log_every=2, log_dir=str(log_dir),
                              loggers=["mlflow"])
    logger = trainer._reporter.loggers[0]
    run_id = logger.run_id
    train_toy(trainer, steps=4)
    trainer.log_images("samples", torch.zeros(4, 3, 8, 8), path=str(tmp_path / "pngs" / "step4.png"))
    trainer.log_images("grid", torch.zeros(2, 3, 8, 8))  # no file: nothing to upload
    summary = trainer.summary()
    trainer.close()

    client = MlflowClient(tracking_uri=logger.tracking_uri)
    run = client.get_run(run_id)
    tags = {k: v for k, v in run.data.tags.items() if not k.startswith("mlflow.")}
    assert tags == {"device": "cpu", "device_plugin": "cpu", "precision": "32-true",
                    "devplug_version": devplug.__version__,
                    "optimizer/sequential": summary["optimizers"]["sequential"]}
    assert sorted(a.path for a in client.list_artifacts(run_id)) == ["images", "summary.json"]
    assert [a.path for a in client.list_artifacts(run_id, "images")] == ["images/step4.png"]
    written = json.loads(open(client.download_artifacts(run_id, "summary.json", str(tmp_path))).read())
    assert written["steps"] == 4 and written["device"] == "cpu" and written["optimizers"] == summary["optimizers"]
    assert run.info.status == "FINISHED"


# ---- Weights & Biases ------------------------------------------------------------------------------------
def _wandb_records(run_dir) -> list:
    """The records of an offline W&B run file (a LevelDB-style log of ``Record`` protobufs)."""
    from wandb.proto import wandb_internal_pb2

    data = open(glob.glob(str(run_dir / "wandb" / "offline-run-*" / "run-*.wandb"))[0], "rb").read()
    assert data[:4] == b":W&B"
    out, pos, pending = [], 7, b""
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        if left < 7:  # a block's tail too short for a record header is padding
            pos += left
            continue
        _checksum, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        pending = chunk if kind in (1, 2) else pending + chunk  # full / first, or middle / last
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            out.append(record)
    return out


def _wandb_history(records: list) -> list[tuple[int | None, dict]]:
    """Each history row of a W&B run, in order: the Trainer's step (``trainer/global_step``, ``None`` when the row
    has none) and the row's values by name (W&B's own ``_step``, ``_timestamp`` ... left out)."""
    rows = []
    for record in records:
        if record.WhichOneof("record_type") == "history":
            values = {item.key or "/".join(item.nested_key): json.loads(item.value_json)
                      for item in record.history.item}
            step = values.pop("trainer/global_step", None)
            rows.append((step, {k: v for k, v in values.items() if not k.startswith("_")}))
    return rows


def test_wandb_logger_by_name_offline(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb", reason="the wandb extra is not installed (pip install 'devplug[wandb]')")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    log_dir = tmp_path / "run"
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False, log_every=2, log_dir=str(log_dir),
                              loggers=["wandb"], hparams=HPARAMS)
    assert isinstance(trainer._reporter.loggers[0], devplug.WandbLogger)
    train_toy(trainer, steps=4)
    trainer.log(val_loss=torch.tensor(0.5))
    trainer.flush_logs()
    trainer.log_images("samples", torch.zeros(4, 3, 8, 8))
    trainer.close()
    wandb.teardown()  # the W&B service writes the run file completely when it stops
    records = _wandb_records(log_dir)
    config: dict = {}
    for record in records:
        kind = record.WhichOneof("record_type")
        if kind in ("run", "config"):
            updates = record.run.config.update if kind == "run" else record.config.update
            config.update({item.key: json.loads(item.value_json) for item in updates})
    assert {k: v for k, v in config.items() if k in FLAT} == FLAT
    assert config["devplug"]["device"] == "cpu" and "optimizer/sequential" in config["devplug"]
    history: dict = {}
    for step, values in _wandb_history(records):
        history.setdefault(step, set()).update(k for k in values if not k.startswith("_"))
    assert {"train/loss", "perf/samples_per_sec", "lr/sequential"} <= history[2]
    assert {"eval/loss", "samples/_type"} <= history[4]
    summaries = [json.loads(item.value_json) for record in records if record.WhichOneof("record_type") == "summary"
                 for item in record.summary.update if item.key == "run"]
    assert summaries and summaries[-1]["steps"] == 4


def test_wandb_uploads_the_png_file_the_trainer_wrote_as_it_is(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="the wandb extra is not installed (pip install 'devplug[wandb]')")
    import wandb

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    log_dir = tmp_path / "run"
    trainer = devplug.Trainer(device="cpu", progress=False, log_dir=str(log_dir), loggers=["wandb"])
    images = torch.rand(6, 3, 8, 8, generator=torch.Generator().manual_seed(0)) * 2 - 1
    trainer.log_images("samples", images, nrow=3, path=str(tmp_path / "grid.png"))
    trainer.close()
    wandb.teardown()
    uploaded = glob.glob(str(log_dir / "wandb" / "offline-run-*" / "files" / "media" / "images" / "samples_*.png"))
    assert [open(p, "rb").read() for p in uploaded] == [(tmp_path / "grid.png").read_bytes()]


@pytest.mark.parametrize("go_back", ["resume", "load"])
def test_wandb_keeps_the_steps_logged_again_after_going_back_to_an_earlier_checkpoint(tmp_path, monkeypatch, go_back):
    # W&B drops a ``log(step=N)`` below the run's current step ("Tried to log to step 3 that is less than the
    # current step 4"): wandb-core's handler, wandb/wandb core/internal/stream/handler.go,
    # handlePartialHistorySync (the real wandb 0.31.0 installed here does it). A run that goes back to the
    # checkpoint of step 2 in the same process logs steps 3 and 4 again: each must reach the run, at its step.
    wandb = pytest.importorskip("wandb", reason="the wandb extra is not installed (pip install 'devplug[wandb]')")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    log_dir, checkpoint = tmp_path / "run", tmp_path / "step2.pt"
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False, log_every=1, log_dir=str(log_dir),
                              loggers=["wandb"])
    model = trainer.setup(make_model())
    opt = trainer.optimizer("sgd", model.parameters(), lr=0.01)
    loader = trainer.dataloader(make_data(64), batch_size=4, num_workers=0)
    trained = []
    for attempt in range(2):
        for _ in trainer.epochs(1, max_steps=4):
            for x, y in loader:
                loss = torch.nn.functional.mse_loss(model(x), y)
                trainer.backward(loss)
                trainer.step(opt)
                trainer.log(loss=loss)
                trained.append((trainer.global_step, loss.item()))
                if trainer.global_step == 2 and attempt == 0:
                    trainer.save(checkpoint)
        if attempt == 0:
            trainer.resume(checkpoint) if go_back == "resume" else trainer.load(checkpoint)
    trainer.close()
    wandb.teardown()  # the W&B service writes the run file completely when it stops
    assert [step for step, _ in trained] == [1, 2, 3, 4, 3, 4]
    records = _wandb_records(log_dir)
    logged = [(step, values["train/loss"]) for step, values in _wandb_history(records) if "train/loss" in values]
    assert logged == [(step, pytest.approx(loss)) for step, loss in trained]
    # every metric is plotted against the Trainer's step
    metrics = {(r.metric.glob_name or r.metric.name): r.metric.step_metric for r in records
               if r.WhichOneof("record_type") == "metric"}
    assert metrics.get("*") == "trainer/global_step"


def test_wandb_without_the_package_is_one_clear_line(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(devplug.ConfigError, match=r"pip install 'devplug\[wandb\]'"):
        devplug.WandbLogger()


# ---- TensorBoard tags -----------------------------------------------------------------------------------
@pytest.mark.parametrize(("name", "tag"), [
    ("loss", "train/loss"), ("val_loss", "eval/loss"), ("eval_accuracy", "eval/accuracy"), ("val/acc", "eval/acc"),
    ("samples_per_sec", "perf/samples_per_sec"), ("data_wait", "perf/data_wait"), ("mfu", "perf/mfu"),
    ("lr/generator", "lr/generator"), ("gan/d_loss", "gan/d_loss"), ("train/loss", "train/loss"),
])
def test_board_tags(name, tag):
    from devplug.core.observe.tensorboard import board_tag

    assert board_tag(name) == tag


def test_tensorboard_tags_are_grouped_and_csv_names_stay(tmp_path):
    log_dir = tmp_path / "run"
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False, log_every=4, log_dir=str(log_dir),
                              loggers=["tensorboard", "csv"])
    _train_with_eval(trainer, epochs=1)
    trainer.close()
    tags = {name for _, name in _tensorboard(log_dir)}
    assert tags >= {"train/loss", "eval/loss", "perf/samples_per_sec", "perf/data_wait", "lr/sequential"}
    assert all(tag.split("/")[0] in ("train", "eval", "perf", "lr") for tag in tags), tags
    assert {name for _, name in _csv(log_dir / "metrics.csv")} >= {"loss", "val_loss", "samples_per_sec"}


# ---- the run's summary -----------------------------------------------------------------------------------
def test_summary_is_a_read_only_mapping_that_prints_a_table_and_converts_to_json():
    from collections.abc import Mapping

    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=False, log_every=2)
    train_toy(trainer, steps=4)
    summary = trainer.summary()
    trainer.close()
    assert isinstance(summary, devplug.RunSummary) and isinstance(summary, Mapping) and not isinstance(summary, dict)
    assert summary["steps"] == 4 and summary.get("precision") == "32-true" and "device" in summary
    with pytest.raises(TypeError):
        summary["steps"] = 5  # type: ignore[index]
    data = summary.to_dict()
    assert json.loads(json.dumps(data)) == data == json.loads(summary.to_json())
    assert data["steps"] == 4 and isinstance(data["memory"], (dict, type(None)))
    lines = str(summary).splitlines()
    assert not str(summary).startswith("{") and len(lines) >= 8
    # the loaders, the input-bound hint (shown when the loop waited for data) and how the peak was obtained
    # are sentences, not figures
    sentences = ("precision_detail", "loaders", "input_bound", "peak ")
    assert all(len(line) <= 100 for line in lines if not line.startswith(sentences))
    columns = {len(line) - len(line.split("  ", 1)[1].lstrip()) for line in lines}
    assert len(columns) == 1, lines  # every value starts in the same column
    assert any(line.startswith("steps") and line.endswith(" 4") for line in lines)
    assert any(line.startswith("optimizers.sequential ") for line in lines)


def test_summary_table_formats_rates_and_shares():
    from devplug.core.observe.summary import format_table

    table = format_table({"samples_per_sec": 12345.678, "data_wait": 0.031, "mfu": 0.4123, "input_bound": None,
                          "memory": devplug.MemoryStats(peak_allocated=3 * 2**20)})
    rows = [("samples_per_sec", "12,346"), ("data_wait", "3.1%"), ("mfu", "41.2%"),
            ("memory.peak_allocated", "3.0 MiB")]
    assert table.splitlines() == [f"{name:<21}  {text}" for name, text in rows]


# ---- the progress bar ------------------------------------------------------------------------------------
def test_progress_figures_fit_in_80_columns(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "80")  # what tqdm sizes its line to when stderr is not a terminal
    monkeypatch.setenv("LINES", "24")
    trainer = devplug.Trainer(device="cpu", precision="32-true", progress=True, log_every=2, price_per_hour=2.0)
    train_toy(trainer, steps=6)
    trainer.close()
    lines = [line.strip() for line in capsys.readouterr().err.replace("\r", "\n").splitlines() if "/6 [" in line]
    assert lines and all(len(line) <= 80 for line in lines), lines
    last = lines[-1]
    for figure in ("/s wait ", "% mfu ", "% loss "):
        assert figure in last, last
    assert last.endswith("]")  # nothing cut


def test_a_long_runs_progress_line_keeps_its_figures_within_80_columns():
    from tqdm import tqdm

    from devplug.core.observe.progress import BAR_FORMAT, progress_postfix

    postfix = progress_postfix({"loss": 0.312345, "samples_per_sec": 12345.6, "data_wait": 0.034, "mfu": 0.4123,
                                "flops_per_sample": 1.2e9, "lr/net": 1e-3})
    line = tqdm.format_meter(45_000, 100_000, 3723.0, ncols=79, unit="step", postfix=postfix, bar_format=BAR_FORMAT)
    assert len(line) <= 79 and line.endswith("12.3k/s wait 3.4% mfu 41% loss 0.312]"), line


def test_progress_postfix_is_short():
    from devplug.core.observe.progress import progress_postfix

    values = {"loss_D": 0.123456, "loss_G": 2.345678, "D_x": 0.5, "samples_per_sec": 12345.6, "data_wait": 0.034,
              "mfu": 0.4123, "flops_per_sample": 1.2e9, "samples_per_dollar": 2.2e7, "lr/generator": 2e-4}
    assert progress_postfix(values) == "12.3k/s wait 3.4% mfu 41% loss_D 0.123 loss_G 2.35"
    assert progress_postfix({"val_loss": 0.5}) == "val_loss 0.5"


def test_progress_postfix_never_shows_exponents_at_the_top_of_a_range():
    from devplug.core.observe.progress import progress_postfix

    # a loader-bound run waits (almost) all the time; samples/s just under a thousand, or a million
    assert progress_postfix({"samples_per_sec": 999.7, "data_wait": 0.997}) == "1k/s wait 100%"
    assert progress_postfix({"samples_per_sec": 999_700.0, "data_wait": 1.0}) == "1M/s wait 100%"
    assert progress_postfix({"samples_per_sec": 999.4, "data_wait": 0.994}) == "999/s wait 99%"


def test_an_evaluation_only_point_keeps_the_last_rates_on_the_bar():
    from devplug.core.observe.reporter import Reporter

    reporter = Reporter(log_dir=None, progress=True, nonfinite="raise", is_main=True, world_size=1)
    reporter.open_progress(10, 0)
    reporter.metrics.add("loss", 0.5)
    reporter.throughput.add(4)
    reporter.throughput.add(4, 0.01)
    reporter.flush(2, synchronize=lambda: None, learning_rates={})
    reporter.metrics.add("val_loss", 0.25)
    reporter.flush(2, synchronize=lambda: None, learning_rates={})
    postfix = reporter.progress_bar.postfix
    reporter.close(2)
    assert "/s wait " in postfix and postfix.endswith("loss 0.5 val_loss 0.25"), postfix
