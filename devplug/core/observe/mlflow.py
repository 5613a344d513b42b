"""An MLflow logger (the ``mlflow`` extra: ``pip install 'devplug[mlflow]'``, which installs ``mlflow-skinny``).

Values go to one MLflow run with ``log_batch`` at each log point; the run ends on the final point.
``mlflow`` is imported when the logger is created, never by ``import devplug``.
"""

from __future__ import annotations

import os
import time
from typing import Any

from devplug.core.contract.hookimpl import hookimpl
from devplug.core.contract.records import LogPoint
from devplug.core.errors import ConfigError


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

    @hookimpl
    def devplug_log(self, point: LogPoint) -> None:
        """``log_batch`` of the point's values at its step; the run is marked finished on the final point."""
        if point.final:
            if self.run_id:
                self.client.set_terminated(self.run_id)
                self.run_id = ""
            return
        if not point.values or not self.run_id:
            return
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics: list[Any] = [Metric(name, float(value), now, point.step) for name, value in point.values.items()]
        self.client.log_batch(self.run_id, metrics=metrics)
