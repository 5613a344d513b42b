"""An MLflow logger (the ``mlflow`` extra: ``pip install 'devplug[mlflow]'``, which installs ``mlflow-skinny``).

Values go to one MLflow run with ``log_batch`` at each log point; hyperparameters become the run's params,
the run's facts (device, precision, optimizers, devplug version) its tags, image files written by
``Trainer.log_images(..., path=...)`` artifacts under ``images/``, and the final summary the artifact
``summary.json``; the run ends on the final point.
``mlflow`` is imported when the logger is created, never by ``import devplug``.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from typing import Any

from devplug.core.contract.hookimpl import hookimpl
from devplug.core.contract.records import LogPoint
from devplug.core.errors import ConfigError

log = logging.getLogger("devplug")

#: The longest param value every MLflow server accepts; longer hyperparameter values are cut there.
MAX_PARAM_LENGTH = 500


class MLflowLogger:
    """Log every value of every log point to an MLflow run.

    ``tracking_uri`` is an MLflow tracking URI (a server, ``databricks``, or a local directory, which
    mlflow ≥ 3 accepts only with ``MLFLOW_ALLOW_FILE_STORE=true``); ``$MLFLOW_TRACKING_URI`` wins when set
    and ``tracking_uri`` is ``None``. The run is created in ``experiment`` at construction, so a tracker
    that cannot be reached fails when the Trainer is built, not in the middle of training.
    """

    def __init__(self, tracking_uri: str | None = None, *, experiment: str = "devplug",
                 run_name: str | None = None) -> None:
        try:
            from mlflow.tracking import MlflowClient
        except ImportError as exc:
            raise ConfigError("the mlflow logger needs mlflow: pip install 'devplug[mlflow]'") from exc
        uri = os.environ.get("MLFLOW_TRACKING_URI") if tracking_uri is None else tracking_uri
        if uri and "://" not in uri and not uri.startswith("databricks"):
            uri = "file://" + os.path.abspath(uri)
        try:
            self.client = MlflowClient(tracking_uri=uri)
            found = self.client.get_experiment_by_name(experiment)
            experiment_id = found.experiment_id if found is not None else self.client.create_experiment(experiment)
            self.run_id: str = self.client.create_run(experiment_id, run_name=run_name).info.run_id
        except Exception as exc:
            first_line = str(exc).split(". ")[0]
            raise ConfigError(f"the mlflow logger cannot start a run at {uri or 'the default store'}: "
                              f"{first_line} (set MLFLOW_TRACKING_URI, or MLFLOW_ALLOW_FILE_STORE=true "
                              "for a local directory)") from exc
        self.tracking_uri = uri
        self._params: dict[str, str] = {}

    @hookimpl
    def devplug_log(self, point: LogPoint) -> None:
        """Metrics (``log_batch`` at the point's step), params (hyperparameters), tags, image files and, on
        the final point, ``summary.json`` as artifacts; the run is then marked finished."""
        if not self.run_id:
            return
        if point.hparams:
            self._log_params(point.hparams)
        if point.tags:
            from mlflow.entities import RunTag

            self.client.log_batch(self.run_id, tags=[RunTag(k, str(v)) for k, v in point.tags.items()])
        for path in point.files.values():
            if os.path.exists(path):
                self.client.log_artifact(self.run_id, path, artifact_path="images")
        if point.final:
            if point.summary:
                self.client.log_dict(self.run_id, dict(point.summary), "summary.json")
            self.client.set_terminated(self.run_id)
            self.run_id = ""
            return
        if not point.values:
            return
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics: list[Any] = [Metric(name, float(value), now, point.step) for name, value in point.values.items()]
        self.client.log_batch(self.run_id, metrics=metrics)

    def _log_params(self, hparams: Mapping[str, Any]) -> None:
        # MLflow params cannot change once logged: a new value for a logged name is reported and left out
        from mlflow.entities import Param

        params = []
        for name, value in hparams.items():
            text = str(value)[:MAX_PARAM_LENGTH]
            if name in self._params and self._params[name] != text:
                log.warning("MLflow keeps the first value of a param: %s stays %s (not %s)",
                            name, self._params[name], text)
                continue
            if name not in self._params:
                self._params[name] = text
                params.append(Param(name, text))
        if params:
            self.client.log_batch(self.run_id, params=params)
