"""A Weights & Biases logger (the ``wandb`` extra: ``pip install 'devplug[wandb]'``).

One W&B run per logger, started on the first point it receives: values go to ``run.log`` under the same
sections as TensorBoard's (``train/``, ``eval/``, ``perf/``, ``lr/``) with the point's step as the value
``trainer/global_step``, every metric's x-axis (``define_metric``), not as W&B's own step: W&B drops a
``log(step=N)`` below the run's current step, which a run that goes back to an earlier checkpoint in the
same process (``Trainer.resume``, ``Trainer.load``) or continues a W&B run (``resume="allow"``) would
log. Each point is one W&B history row; W&B's ``_step`` counts rows. Images go as
``wandb.Image``, hyperparameters into the run's config, the run's facts (device, precision, optimizers,
devplug version) into ``config["devplug"]``, and the final summary into ``summary["run"]`` before it
finishes. ``wandb`` is imported when the logger is created, never by ``import devplug``. ``WANDB_MODE=offline``
writes the run under ``dir`` only (``wandb sync`` uploads it later).
"""

from __future__ import annotations

import os
from typing import Any

import torch

from devplug.core.contract.hookimpl import hookimpl
from devplug.core.contract.records import LogPoint
from devplug.core.errors import ConfigError
from devplug.core.observe.tensorboard import board_tag

#: The x-axis every metric is plotted against: the Trainer's step, logged as a value in each row.
STEP_METRIC = "trainer/global_step"


class WandbLogger:
    """Log every point to a Weights & Biases run in ``project``.

    ``dir`` is where W&B keeps its files (the Trainer's ``log_dir`` for ``loggers=["wandb"]``); ``name``
    names the run; other keyword arguments go to ``wandb.init`` (``entity``, ``group``, ``tags``, ``mode``,
    ``id`` and ``resume="allow"`` to continue a W&B run). Every value is plotted against ``trainer/global_step``
    (the Trainer's step), so a point at a step below one already logged (after going back to an earlier
    checkpoint) is kept, not dropped by W&B.
    """

    def __init__(self, project: str = "devplug", *, dir: str | os.PathLike[str] | None = None,
                 name: str | None = None, **init_options: Any) -> None:
        try:
            import wandb
        except ImportError as exc:
            raise ConfigError("the wandb logger needs wandb: pip install 'devplug[wandb]'") from exc
        self._wandb = wandb
        self.project = project
        self.dir = os.fspath(dir) if dir is not None else None
        self.name = name
        self.init_options = init_options
        self.run: Any = None
        self._finished = False

    def _start(self, config: dict[str, Any]) -> Any:
        if self.run is None and not self._finished:
            if self.dir is not None:
                os.makedirs(self.dir, exist_ok=True)
            self.run = self._wandb.init(project=self.project, dir=self.dir, name=self.name, config=config,
                                        **self.init_options)
            if self.run is not None:
                # W&B's recommended way to log out of order (https://wandb.me/define-metric): a step metric of
                # our own as every metric's x-axis, so no row depends on W&B's monotonic ``step``
                self.run.define_metric(STEP_METRIC)
                self.run.define_metric("*", step_metric=STEP_METRIC)
        return self.run

    @hookimpl
    def devplug_log(self, point: LogPoint) -> None:
        """``run.log`` of the point's values and images (the PNG file the Trainer wrote of an image, when it wrote
        one) with its step as ``trainer/global_step``; hyperparameters and facts into the config; on the final
        point the summary into ``run.summary``, then ``run.finish()``."""
        if point.final:
            if self.run is not None:
                if point.summary:
                    self.run.summary.update({"run": dict(point.summary)})
                self.run.finish()
                self.run = None
            self._finished = True
            return
        run = self._start(dict(point.hparams))
        if run is None:
            return
        if point.hparams:
            run.config.update(dict(point.hparams), allow_val_change=True)
        if point.tags:
            run.config.update({"devplug": {**run.config.get("devplug", {}), **point.tags}}, allow_val_change=True)
        data: dict[str, Any] = {board_tag(name): value for name, value in point.values.items()}
        for tag, image in point.images.items():
            path = point.files.get(tag)
            if path is not None and os.path.isfile(path):  # the PNG the Trainer wrote: uploaded as it is
                data[tag] = self._wandb.Image(path)
                continue
            pixels = (image.detach().float().clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0)
            data[tag] = self._wandb.Image(pixels.squeeze(-1).cpu().numpy() if pixels.shape[-1] == 1
                                          else pixels.cpu().numpy())
        if data:
            # no ``step=``: W&B would drop a step below its current one (a run gone back to an earlier checkpoint)
            run.log({**data, STEP_METRIC: point.step})

