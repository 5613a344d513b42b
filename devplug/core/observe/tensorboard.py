"""The TensorBoard logger: scalars grouped into sections, images, and the run's hyperparameters.

Scalars are grouped by tag (the CSV and JSON Lines loggers keep the names as logged):

- ``train/<name>`` for values logged with ``Trainer.log``;
- ``eval/<name>`` for values logged as ``eval_<name>``, ``val_<name>``, ``eval/<name>`` or ``val/<name>``;
- ``perf/<name>`` for what the Trainer measures: ``samples_per_sec``, ``data_wait``, ``mfu``,
  ``flops_per_sample``, ``samples_per_dollar``;
- ``lr/<optimizer>`` for learning rates; any other name with a ``/`` (``gan/d_loss``) is the author's own
  section and kept as it is.

Hyperparameters go to the hparams dashboard as the run's own session: its start info in the run's event
file with the first values (TensorBoard reads the first one only, so hyperparameters given after that stay
in the other loggers, with a warning), its end info at the final point. The dashboard's metric columns are
then the run's own scalars with their last values: nothing is duplicated into a second, timestamped run
directory with metric values fixed in advance, as ``SummaryWriter.add_hparams`` does.

An image grid the Trainer wrote as a PNG file (``Trainer.log_images(..., path=...)``) goes into the event file
as those bytes, not encoded a second time; the event records' checksums are computed in C where google-crc32c
is installed (`devplug.core.observe.event_checksums`).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from devplug.core.contract.hookimpl import hookimpl
from devplug.core.contract.records import LogPoint
from devplug.core.observe.metrics import MEASURED_NAMES

log = logging.getLogger("devplug")

#: Values the Trainer measures at log points, shown under ``perf/``.
PERF_NAMES = MEASURED_NAMES

#: Prefixes that mark a logged value as an evaluation figure, shown under ``eval/`` without the prefix.
EVAL_PREFIXES = ("eval_", "val_", "eval/", "val/")


def evaluation_name(name: str) -> bool:
    """True for a name that marks an evaluation figure: ``val_loss``, ``eval_acc``, ``val/loss``, ``eval/acc``."""
    return any(name.startswith(prefix) and len(name) > len(prefix) for prefix in EVAL_PREFIXES)


def board_tag(name: str) -> str:
    """The TensorBoard tag of a logged value: ``loss`` → ``train/loss``, ``val_acc`` → ``eval/acc``, ..."""
    if name in PERF_NAMES:
        return f"perf/{name}"
    for prefix in EVAL_PREFIXES:
        if name.startswith(prefix) and len(name) > len(prefix):
            return f"eval/{name[len(prefix):]}"
    return name if "/" in name else f"train/{name}"


class TensorBoardLogger:
    """Scalars, images and hyperparameters to a TensorBoard event file under ``log_dir`` (written on first use)."""

    def __init__(self, log_dir: str | os.PathLike[str]) -> None:
        self.log_dir = os.fspath(log_dir)
        self._writer: Any = None
        self._hparams: dict[str, Any] = {}
        self._session: Any = None  # the hparams summaries once the session start is written
        self._purge_step: int | None = None  # after a resume: points from this step on, written before, are hidden

    @property
    def writer(self) -> Any:
        """The ``SummaryWriter``, created on first use (tensorboard is imported only then)."""
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter  # lazy: tensorboard is heavy

            from devplug.core.observe.event_checksums import use_native_record_checksums

            _quiet_background_write_failures()
            use_native_record_checksums()
            self._writer = SummaryWriter(self.log_dir, purge_step=self._purge_step)
        return self._writer

    @hookimpl
    def devplug_log(self, point: LogPoint) -> None:
        """``add_scalar`` per value (grouped tags), an image per image (the PNG file the Trainer wrote of it, when
        it wrote one, else ``add_image``), hyperparameters to the hparams dashboard; closes the writer on the final
        point. On a resume, the points past the resumed step that the interrupted run wrote are purged
        (``SummaryWriter(purge_step=...)``)."""
        if point.resumed:
            if self._writer is not None:
                self._writer.close()
                self._writer = None
            self._purge_step = point.step + 1
            return
        if point.final:
            if self._hparams:
                self._start_session()
                self._write(self._session[2])
            if self._writer is not None:
                self._writer.close()
                self._writer = None
            return
        if point.hparams:
            if self._session is not None:
                log.warning("TensorBoard keeps the hyperparameters it had at the run's first values; %s came "
                            "later and are only in the other loggers", ", ".join(point.hparams))
            else:
                self._hparams.update(point.hparams)
        if point.values or point.images:
            self._start_session()
        for name, value in point.values.items():
            self.writer.add_scalar(board_tag(name), value, point.step)
        for tag, image in point.images.items():
            png = _read_png(point.files.get(tag))
            if png is None:
                self.writer.add_image(tag, image, point.step)
            else:  # the PNG the Trainer just wrote of this grid: the same pixels, not encoded a second time
                self.writer.file_writer.add_summary(_image_summary(tag, png, image), point.step)

    def _start_session(self) -> None:
        # TensorBoard reads one session start per run (the first), so it is written once, with the run's
        # first values; no experiment summary: the dashboard then takes the hyperparameters from the session
        # start and its metrics from the run's own scalars (their last values)
        if self._session is None and self._hparams:
            from torch.utils.tensorboard.summary import hparams

            self._session = hparams(self._hparams, {})
            self._write(self._session[1])

    def _write(self, summary: Any) -> None:
        self.writer.file_writer.add_summary(summary)
        self.writer.flush()


def _read_png(path: str | None) -> bytes | None:
    """The bytes of the PNG file at ``path`` (None without a path, when it cannot be read, or is no PNG)."""
    if path is None:
        return None
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError:
        return None
    return data if data.startswith(b"\x89PNG\r\n\x1a\n") else None


def _image_summary(tag: str, png: bytes, grid: Any) -> Any:
    """A TensorBoard image summary of ``png``, the encoded ``grid`` (C×H×W), as ``add_image`` writes one."""
    from tensorboard.compat.proto.summary_pb2 import Summary

    channels, height, width = grid.shape
    image = Summary.Image(height=height, width=width, colorspace=channels, encoded_image_string=png)
    return Summary(value=[Summary.Value(tag=tag, image=image)])


def _quiet_background_write_failures() -> None:
    """Keep tensorboard's background writer from printing a traceback when a write fails (a full disk).

    It keeps the error and raises it again at the next write on the training thread, where the Trainer
    reports it once as one line and training goes on; other threads' errors print as before.
    """
    import threading

    previous = threading.excepthook
    if getattr(previous, "devplug_quiet", False):
        return

    def hook(args: Any) -> None:
        if type(args.thread).__name__ == "_AsyncWriterThread" and isinstance(args.exc_value, OSError):
            return
        previous(args)

    hook.devplug_quiet = True  # type: ignore[attr-defined]
    threading.excepthook = hook
