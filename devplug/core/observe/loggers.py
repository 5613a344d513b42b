"""Loggers: where the values of each log point go (rank 0 only).

A logger is any object with a ``devplug_log(point)`` method taking a `LogPoint`,
the same signature as the ``devplug_log`` hook, so a logger can be given to one Trainer
(``Trainer(loggers=[...])``) or registered as a device-neutral plugin for every Trainer. Built in:
TensorBoard, CSV and JSON Lines (and MLflow, `devplug.core.observe.mlflow`, with the ``mlflow``
extra). Loggers receive host floats read once at the log point: they never touch the device.
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Callable, Iterable
from typing import Any, Protocol, runtime_checkable

from devplug.core.contract.hookimpl import hookimpl
from devplug.core.contract.records import LogPoint


@runtime_checkable
class Logger(Protocol):
    """What a logger implements: receive one `LogPoint` (values, images, or the final one)."""

    def devplug_log(self, point: LogPoint) -> None:
        """Write ``point``; on ``point.final``, flush and close."""


class TensorBoardLogger:
    """Scalars and images to a TensorBoard event file under ``log_dir`` (the writer is created on first use)."""

    def __init__(self, log_dir: str | os.PathLike[str]) -> None:
        self.log_dir = os.fspath(log_dir)
        self._writer: Any = None

    @property
    def writer(self) -> Any:
        """The ``SummaryWriter``, created on first use (tensorboard is imported only then)."""
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter  # lazy: tensorboard is heavy

            self._writer = SummaryWriter(self.log_dir)
        return self._writer

    @hookimpl
    def devplug_log(self, point: LogPoint) -> None:
        """``add_scalar`` per value, ``add_image`` per image; closes the writer on the final point."""
        if point.final:
            if self._writer is not None:
                self._writer.close()
                self._writer = None
            return
        for name, value in point.values.items():
            self.writer.add_scalar(name, value, point.step)
        for tag, image in point.images.items():
            self.writer.add_image(tag, image, point.step)


class CSVLogger:
    """One row per value, ``step,name,value``, appended to ``path`` (a header when the file is new).

    The long layout keeps every value whatever names appear later in the run; a spreadsheet pivots it.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._file: Any = None

    @hookimpl
    def devplug_log(self, point: LogPoint) -> None:
        """Append the point's values; flushed at every point, closed on the final one."""
        if point.final:
            if self._file is not None:
                self._file.close()
                self._file = None
            return
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
    """One JSON object per log point, ``{"step": 10, "loss": 0.3, ...}``, appended to ``path``."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)

    @hookimpl
    def devplug_log(self, point: LogPoint) -> None:
        """Append one line with the point's step and values (non-finite values as strings)."""
        if point.final or not point.values:
            return
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        record = {"step": point.step, **{k: _json_number(v) for k, v in point.values.items()}}
        with open(self.path, "a", encoding="utf-8") as file:
            file.write(json.dumps(record) + "\n")


def _json_number(value: float) -> float | str:
    value = float(value)
    return value if value == value and abs(value) != float("inf") else str(value)


def _mlflow(log_dir: str) -> Logger:
    from devplug.core.observe.mlflow import MLflowLogger

    return MLflowLogger(tracking_uri=os.path.join(log_dir, "mlruns"))


#: Loggers named in ``Trainer(loggers=[...])``, each built from the Trainer's ``log_dir``.
NAMED_LOGGERS: dict[str, Callable[[str], Logger]] = {
    "tensorboard": TensorBoardLogger,
    "csv": lambda log_dir: CSVLogger(os.path.join(log_dir, "metrics.csv")),
    "jsonl": lambda log_dir: JSONLinesLogger(os.path.join(log_dir, "metrics.jsonl")),
    "mlflow": _mlflow,
}


def check_logger(item: Any) -> None:
    """Raise ValueError unless ``item`` is a logger name or an object with a ``devplug_log`` method."""
    if isinstance(item, str):
        if item not in NAMED_LOGGERS:
            raise ValueError(f"unknown logger {item!r}; use one of {', '.join(NAMED_LOGGERS)} or a logger object")
    elif not callable(getattr(item, "devplug_log", None)):
        raise ValueError(f"logger {item!r} has no devplug_log(point) method (see docs/trainer.md#loggers)")


def build_loggers(items: Iterable[Any], log_dir: str | None) -> list[Logger]:
    """Logger objects for ``items``: names are built under ``log_dir`` (skipped without one), objects kept."""
    loggers: list[Logger] = []
    for item in items:
        if isinstance(item, str):
            if log_dir:
                loggers.append(NAMED_LOGGERS[item](log_dir))
        else:
            loggers.append(item)
    return loggers
