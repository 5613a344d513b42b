"""Loggers: where the values of each log point go (rank 0 only).

A logger is any object with a ``devplug_log(point)`` method taking a `LogPoint`,
the same signature as the ``devplug_log`` hook, so a logger can be given to one Trainer
(``Trainer(loggers=[...])``) or registered as a device-neutral plugin for every Trainer. Built in:
TensorBoard (`devplug.core.observe.tensorboard`), CSV and JSON Lines, MLflow
(`devplug.core.observe.mlflow`, with the ``mlflow`` extra) and Weights & Biases
(`devplug.core.observe.wandb`, with the ``wandb`` extra). Loggers receive host floats read once at the
log point: they never touch the device.

TensorBoard is the default logger and an optional dependency (the ``tensorboard`` extra): where it is not
installed, a Trainer that uses the default writes ``metrics.csv`` instead and says so in one line.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import logging
import math
import os
from collections.abc import Callable, Iterable
from typing import Any, Protocol, runtime_checkable

from devplug.core.contract.hookimpl import hookimpl
from devplug.core.contract.records import LogPoint
from devplug.core.observe.tensorboard import TensorBoardLogger

log = logging.getLogger("devplug")


@runtime_checkable
class Logger(Protocol):
    """What a logger implements: receive one `LogPoint` (values, images, or the final one)."""

    def devplug_log(self, point: LogPoint) -> None:
        """Write ``point``; on ``point.final``, flush and close."""


class CSVLogger:
    """One row per value, ``step,name,value``, appended to ``path`` (a header when the file is new).

    The long layout keeps every value whatever names appear later in the run; a spreadsheet pivots it.
    Hyperparameters go to a JSON file beside it, ``metrics.csv`` → ``metrics.hparams.json`` (``hparams_path``),
    so the CSV stays plain rows any CSV reader loads and the hyperparameters keep their types.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self.hparams_path = os.path.splitext(self.path)[0] + ".hparams.json"
        self._file: Any = None
        self._hparams: dict[str, Any] = {}

    @hookimpl
    def devplug_log(self, point: LogPoint) -> None:
        """Append the point's values (flushed at every point, closed on the final one); rewrite the
        hyperparameters' file with all of them so far."""
        if point.final or point.resumed:
            if self._file is not None:
                self._file.close()
                self._file = None
            if point.resumed:
                _rewrite_lines(self.path, lambda line, first: first or _csv_step(line) <= point.step)
            return
        if point.hparams:
            self._hparams.update(point.hparams)
            os.makedirs(os.path.dirname(os.path.abspath(self.hparams_path)), exist_ok=True)
            with open(self.hparams_path, "w", encoding="utf-8") as file:
                json.dump(self._hparams, file, indent=2)
                file.write("\n")
        if not point.values:
            return
        if self._file is None:
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
            new = not os.path.exists(self.path) or os.path.getsize(self.path) == 0
            self._file = open(self.path, "a", newline="", encoding="utf-8")
            if new:
                csv.writer(self._file).writerow(("step", "name", "value"))
        writer = csv.writer(self._file)
        for name, value in point.values.items():
            writer.writerow((point.step, name, repr(float(value))))
        self._file.flush()


class JSONLinesLogger:
    """One JSON object per log point, ``{"step": 10, "loss": 0.3, ...}``, appended to ``path``.

    Hyperparameters are a record of their own, ``{"hparams": {"lr": 0.001, ...}}``: the first line when
    they are given to the Trainer, a later one for each ``Trainer.log_hparams`` call. Value records always
    have a ``"step"``; a reader tells the two apart by that key.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)

    @hookimpl
    def devplug_log(self, point: LogPoint) -> None:
        """Append one line with the point's step and values (non-finite values as strings), or its hyperparameters.

        On a resume, the lines of steps past the resumed one are dropped (the file is rewritten atomically).
        """
        if point.resumed:
            _rewrite_lines(self.path, lambda line, _first: _json_step(line) <= point.step)
            return
        if point.final:
            return
        records: list[dict[str, Any]] = []
        if point.hparams:
            records.append({"hparams": dict(point.hparams)})
        if point.values:
            records.append({"step": point.step, **{k: _json_number(v) for k, v in point.values.items()}})
        if not records:
            return
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as file:
            file.write("".join(json.dumps(record) + "\n" for record in records))


def _csv_step(line: str) -> float:
    try:
        return float(line.split(",", 1)[0])
    except ValueError:
        return -math.inf  # not a value row: kept


def _json_step(line: str) -> float:
    try:
        record = json.loads(line)
    except ValueError:
        return -math.inf
    step = record.get("step") if isinstance(record, dict) else None
    return float(step) if isinstance(step, (int, float)) else -math.inf  # hyperparameters: kept


def _rewrite_lines(path: str, keep: Callable[[str, bool], bool]) -> None:
    """Rewrite ``path`` with the lines ``keep(line, is_first)`` accepts (atomic; nothing when it does not exist)."""
    try:
        with open(path, encoding="utf-8", newline="") as file:
            lines = file.read().splitlines(keepends=True)
    except FileNotFoundError:
        return
    kept = [line for index, line in enumerate(lines) if keep(line, index == 0)]
    if len(kept) == len(lines):
        return
    temp = f"{path}.{os.getpid()}.tmp"
    with open(temp, "w", encoding="utf-8", newline="") as file:
        file.writelines(kept)
    os.replace(temp, path)


def _json_number(value: float) -> float | str:
    value = float(value)
    return value if value == value and abs(value) != float("inf") else str(value)


def _mlflow(log_dir: str) -> Logger:
    from devplug.core.observe.mlflow import MLflowLogger

    return MLflowLogger(tracking_uri=os.path.join(log_dir, "mlruns"))


def _wandb(log_dir: str) -> Logger:
    from devplug.core.observe.wandb import WandbLogger

    return WandbLogger(dir=log_dir)


#: Loggers named in ``Trainer(loggers=[...])``, each built from the Trainer's ``log_dir``.
NAMED_LOGGERS: dict[str, Callable[[str], Logger]] = {
    "tensorboard": TensorBoardLogger,
    "csv": lambda log_dir: CSVLogger(os.path.join(log_dir, "metrics.csv")),
    "jsonl": lambda log_dir: JSONLinesLogger(os.path.join(log_dir, "metrics.jsonl")),
    "mlflow": _mlflow,
    "wandb": _wandb,
}


def check_logger(item: Any) -> None:
    """Raise ValueError unless ``item`` is a logger name or an object with a ``devplug_log`` method."""
    if isinstance(item, str):
        if item not in NAMED_LOGGERS:
            raise ValueError(f"unknown logger {item!r}; use one of {', '.join(NAMED_LOGGERS)} or a logger object")
    elif not callable(getattr(item, "devplug_log", None)):
        raise ValueError(f"logger {item!r} has no devplug_log(point) method (see docs/trainer.md#loggers)")


def tensorboard_installed() -> bool:
    """Whether the ``tensorboard`` package is installed (torch's ``SummaryWriter`` needs it); imports nothing."""
    try:
        return importlib.util.find_spec("tensorboard") is not None
    except (ImportError, ValueError):  # a broken or half-removed installation
        return False


def build_loggers(items: Iterable[Any], log_dir: str | None, *, default: bool = False) -> list[Logger]:
    """Logger objects for ``items``: names are built under ``log_dir`` (skipped without one), objects kept.

    ``default``: ``items`` is the Trainer's default, not the author's choice, so TensorBoard falls back to
    CSV where tensorboard is not installed (with a one-line note) instead of failing at the first log point.
    """
    loggers: list[Logger] = []
    for item in items:
        if isinstance(item, str):
            if log_dir:
                if default and item == "tensorboard" and not tensorboard_installed():
                    item = "csv"
                    log.warning("tensorboard is not installed: logging to %s instead "
                                "(pip install 'devplug[tensorboard]' for TensorBoard)",
                                os.path.join(log_dir, "metrics.csv"))
                loggers.append(NAMED_LOGGERS[item](log_dir))
        else:
            loggers.append(item)
    return loggers
