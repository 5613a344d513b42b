"""What a Trainer reports: logged values at log points, the loggers, the progress bar, throughput.

Values stay on the device between log points (`MetricBuffer`); at a log
point they are averaged, reduced across ranks, checked for NaN/inf, handed to the loggers and the
``devplug_log`` hook as a `LogPoint` (rank 0), and shown on the progress bar.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from devplug.core.checkpoint.diskfull import disk_full_cause, disk_full_line, write_atomically
from devplug.core.contract.records import LogPoint
from devplug.core.errors import NonFiniteLossError
from devplug.core.observe.flops import FlopMeter
from devplug.core.observe.loggers import Logger, TensorBoardLogger
from devplug.core.observe.metrics import MetricBuffer, Throughput, logged_number, nonfinite
from devplug.core.observe.progress import BAR_FORMAT, progress_postfix

log = logging.getLogger("devplug")


#: Share of wall time waiting for the loader above which a run counts as input-bound.
INPUT_BOUND_SHARE = 0.1


def input_bound_hint(rate: float, wait_share: float, threshold: float = INPUT_BOUND_SHARE) -> str | None:
    """One line when the loop waited for its loader more than ``threshold`` of the time, else ``None``.

    The loader delivers what the run achieved (``rate``); the step alone would consume ``rate / (1 - wait)``.
    """
    if rate <= 0 or wait_share <= threshold:
        return None
    consumes = rate / max(1.0 - wait_share, 1e-9)
    return (f"input-bound: loader delivers {rate:,.1f} samples/s, step consumes {consumes:,.1f} samples/s "
            f"({wait_share:.0%} of the time waiting for data); try the cache / more workers / DALI")


class Reporter:
    """Logged values, throughput, loggers and progress bar of one Trainer.

    ``log_dir``, ``loggers`` and ``progress`` apply on the main process only; ``publish`` hands each
    `LogPoint` to the plugins (the ``devplug_log`` hook); ``nonfinite`` is the policy for a NaN/inf
    value (``"raise"``, ``"warn"``, ``"ignore"``); ``reduce`` averages values across ranks at log points
    (``None`` in a single process). ``replicas``: the processes that read different batches (the
    data-parallel groups; default ``world_size``): the ranks of a tensor-parallel group share their samples,
    so the job's samples/s is one rank's rate times ``replicas``, and one device's share of it is that over
    ``world_size``.
    """

    def __init__(self, *, log_dir: str | None, progress: bool, nonfinite: str, is_main: bool, world_size: int,
                 reduce: Callable[[torch.Tensor], torch.Tensor] | None = None, loggers: Sequence[Logger] = (),
                 publish: Callable[[LogPoint], Any] | None = None, replicas: int | None = None) -> None:
        self.log_dir = log_dir if is_main else None
        self.loggers: list[Logger] = list(loggers) if is_main else []
        self.publish = publish if is_main else None
        self.show_progress = progress and is_main
        self.nonfinite_policy = nonfinite
        self.is_main = is_main
        self.world_size = world_size
        self.replicas = world_size if replicas is None else replicas
        self.reduce = reduce
        self.metrics = MetricBuffer()
        self.throughput = Throughput()
        self.flops = FlopMeter(steps_done=lambda: 0, samples_done=lambda: 0, peak=lambda: None, enabled=False)
        self.last_metrics: dict[str, float] = {}
        self.evaluation: dict[str, float] = {}  # the last value of each evaluation figure, as logged
        self.progress_bar: Any = None
        self._closed = False
        self._failed_writes: set[str] = set()

    # ---- loggers ------------------------------------------------------------------------------------
    @property
    def writer(self) -> Any:
        """The TensorBoard SummaryWriter (rank 0, with a TensorBoard logger), created on first use; else None."""
        board = next((lg for lg in self.loggers if isinstance(lg, TensorBoardLogger)), None)
        return board.writer if board is not None else None

    def emit(self, point: LogPoint) -> None:
        """Hand ``point`` to every logger, then to the plugins' ``devplug_log`` (main process only)."""
        self._closed = point.final
        for logger in self.loggers:
            try:
                logger.devplug_log(point)
            except OSError as exc:  # a full disk (or one gone): reported once, and training goes on
                self._write_failed(type(logger).__name__, f"the {type(logger).__name__} log", exc)
        if self.publish is not None:
            self.publish(point)

    def log_images(self, tag: str, images: torch.Tensor, step: int, *, nrow: int = 8,
                   path: str | None = None) -> None:
        """Write a grid of images (N×C×H×W in [-1, 1]) to TensorBoard and optionally a PNG file (rank 0)."""
        if not self.is_main:
            return
        from devplug.core.observe.grid import image_grid, write_png  # torchvision's grid, without importing it

        grid = image_grid(images.detach().float().cpu(), nrow=nrow, value_range=(-1, 1))
        if path is not None:
            try:  # atomically: a PNG is there whole or not at all
                write_atomically(path, lambda handle: write_png(grid, handle))
            except OSError as exc:
                self._write_failed("images", f"the image {path}", exc)
                path = None
        self.emit(LogPoint(step=step, images={tag: grid}, log_dir=self.log_dir,
                           files={tag: os.path.abspath(path)} if path is not None else {}))

    def _write_failed(self, kind: str, what: str, exc: OSError) -> None:
        """One warning per kind of output that could not be written (a full disk, a folder gone); the run goes on."""
        if kind in self._failed_writes:
            return
        self._failed_writes.add(kind)
        full = disk_full_cause(exc)
        reason = disk_full_line(what, full) if full is not None else f"could not write {what} ({exc})"
        log.warning("%s; training goes on without it", reason)

    def log_run(self, step: int, *, hparams: Mapping[str, Any] | None = None,
                tags: Mapping[str, str] | None = None) -> None:
        """Hand hyperparameters and facts about the run (a point with no values) to the loggers (rank 0)."""
        if self.is_main and (hparams or tags) and not self._closed:
            self.emit(LogPoint(step=step, log_dir=self.log_dir, hparams=dict(hparams or {}), tags=dict(tags or {})))

    def resumed(self, step: int) -> None:
        """The run continues from the checkpoint of ``step``: the loggers drop what was written past it (rank 0)."""
        if self.is_main:
            self.emit(LogPoint(step=step, log_dir=self.log_dir, resumed=True))

    # ---- progress -----------------------------------------------------------------------------------
    def open_progress(self, total: int | None, initial: int) -> None:
        """Show a progress bar of ``total`` steps (``None``: unknown) starting at ``initial``."""
        if not self.show_progress:
            return
        from tqdm.auto import tqdm

        self.progress_bar = tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True,
                                 mininterval=5.0, smoothing=0.1, bar_format=BAR_FORMAT if total else None)

    def close_progress(self) -> None:
        """Close the progress bar, if one is shown."""
        if self.progress_bar is not None:
            self.progress_bar.close()
            self.progress_bar = None

    # ---- log points ---------------------------------------------------------------------------------
    def flush(
        self,
        step: int,
        *,
        synchronize: Callable[[], None],
        learning_rates: Mapping[str, Any],
        across_ranks: bool = True,
    ) -> dict[str, float] | None:
        """Report pending values at ``step``: the only place they are read from the device."""
        if not self.metrics:
            return dict(self.last_metrics) if self.last_metrics else None
        synchronize()
        stepped = self.throughput.samples_since > 0  # no training batch since the last point: no rate to report
        rate = self.throughput.lap() if stepped else 0.0
        values = self.metrics.flush(self.reduce if across_ranks else None)
        bad = nonfinite(values)
        if bad:
            self._on_nonfinite(bad, values, step)
        if stepped:
            job = rate * self.replicas
            values["samples_per_sec"] = job
            values["data_wait"] = self.throughput.wait_share
            values.update(self.flops.figures(job / self.world_size, job))
            for key, lr in learning_rates.items():
                if isinstance(lr, (int, float)):
                    values[f"lr/{key}"] = float(lr)
        shown = values if stepped else {**self.last_metrics, **values}  # the bar keeps the last rates
        self.last_metrics = {**self.evaluation, **values}
        if self.is_main:
            self.emit(LogPoint(step=step, values=dict(values), log_dir=self.log_dir))
            if self.progress_bar is not None:
                bar = self.progress_bar
                bar.n = step
                bar.set_postfix_str(progress_postfix(shown), refresh=False)
                if bar.total is None or step < bar.total:  # the last line is shown once, when the bar closes
                    bar.refresh()
        return values

    def write_now(self, step: int, scalars: Mapping[str, Any]) -> dict[str, float]:
        """Write evaluation values as logged, at ``step``, now: read back, checked, to the loggers (rank 0).

        Not averaged with other values nor across ranks (not a collective): reduce them first, as
        ``trainer.all_reduce`` does, so that every rank logs the same figure.
        """
        values: dict[str, float] = {}
        for name, value in scalars.items():
            if isinstance(value, torch.Tensor):
                if value.numel() != 1:
                    raise ValueError(f"logged value {name!r} must be a scalar, got shape {tuple(value.shape)}")
                value = value.item()
            values[name] = logged_number(name, value)
        bad = nonfinite(values)
        if bad:
            self._on_nonfinite(bad, values, step)
        self.evaluation.update(values)
        self.last_metrics = {**self.last_metrics, **values}
        if self.is_main:
            self.emit(LogPoint(step=step, values=dict(values), log_dir=self.log_dir))
            if self.progress_bar is not None:
                self.progress_bar.set_postfix_str(progress_postfix(self.last_metrics), refresh=False)
        return values

    def _on_nonfinite(self, bad: list[str], values: dict[str, float], step: int) -> None:
        message = (
            f"{', '.join(f'{k}={values[k]}' for k in bad)} at step {step}: training diverged. "
            "Lower the learning rate, check the input data, or try precision='32-true'; "
            "checkpoints already saved are untouched"
        )
        if self.nonfinite_policy == "raise":
            raise NonFiniteLossError(message)
        if self.nonfinite_policy == "warn":
            warnings.warn(message, RuntimeWarning, stacklevel=4)

    def flush_quietly(self, flush: Callable[[], Any]) -> None:
        """Report pending values on the way out of a loop; a failure there is logged, not raised."""
        if not self.metrics:
            return
        try:
            flush()
        except Exception as exc:  # the loop may be unwinding (break, exception): do not mask it
            log.warning("values logged before leaving the loop were not reported: %s", exc)

    def settle(self, synchronize: Callable[[], None]) -> None:
        """The loop ended: the run's mean rate takes in the steps since the last log point (a failure to
        synchronise is logged, not raised: the loop may be unwinding); the throughput clock then stands still
        until the next training batch."""
        if self.throughput.samples_since > 0:
            try:
                synchronize()
            except Exception as exc:
                log.warning("the run's last steps are left out of its mean rate: %s", exc)
            else:
                self.throughput.settle()
        self.throughput.idle()

    def rates(self) -> dict[str, Any]:
        """Mean throughput of the whole job, to the last log point or the end of the loop: ``samples_per_sec``,
        ``samples_per_hour``, ``data_wait`` (this rank's share of wall time spent waiting for the loader),
        ``input_bound`` (a hint, or None), and where known ``flops_per_sample``, ``peak_flops`` and
        ``peak_source`` (the peak MFU is computed against, and where it comes from), ``mfu`` (one device's
        achieved FLOP/s over its peak), ``samples_per_dollar`` (with ``price_per_hour``), ``achieved_flops``
        (one device's), ``peak`` (the peak in one line: value, format, source, how it was obtained) and, when
        a plain GEMM's rate was measured, ``gemm_flops`` and ``gemm_fraction`` (achieved over it)."""
        rate = self.throughput.mean_rate * self.replicas
        per_device = rate / self.world_size
        wait = self.throughput.mean_wait_share
        out = {"samples_per_sec": rate, "samples_per_hour": rate * 3600, "data_wait": wait,
               "input_bound": input_bound_hint(rate, wait), **self.flops.figures(per_device, rate)}
        if "peak_flops" in out and self.flops.peak_record is not None:
            out["peak_source"] = self.flops.peak_record.source
        return {**out, **self.flops.efficiency(per_device)}

    @property
    def closed(self) -> bool:
        """True once the final point was sent (until another point is)."""
        return self._closed

    def close(self, step: int, summary: Mapping[str, Any] | None = None) -> None:
        """Send the final point, with the run's ``summary``, to the loggers and plugins (once); close the bar."""
        if self.is_main and not self._closed:
            self._closed = True
            self.emit(LogPoint(step=step, log_dir=self.log_dir, final=True, summary=dict(summary or {})))
        self.close_progress()

