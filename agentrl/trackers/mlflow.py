"""MLflow, in a file store under the run folder by default (``RUN/mlruns``); ``MLFLOW_TRACKING_URI`` picks another.

The config becomes the run's params (dotted keys, ``trainer.dtype``) and a ``config.json`` artifact; each metrics row
a batch of metrics at its step; each table a JSON artifact in MLflow's table layout (``{"columns", "data"}``, as
`mlflow.log_table` writes it, without needing pandas) at ``<name>/step_<step>.json``.

MLflow 3 keeps the file store in maintenance mode and refuses it unless ``MLFLOW_ALLOW_FILE_STORE`` is set: it is set
here for the default store, which needs no database and no server (``mlflow ui --backend-store-uri RUN/mlruns``
shows it). MLflow's usage telemetry is switched off (``MLFLOW_DISABLE_TELEMETRY``) unless set otherwise: a run
contacts no server on its own.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from typing import Any

from agentrl.trackers.base import Table, TrackerSettings

__all__ = ["MlflowTracker", "flatten"]


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings as one level of dotted keys (``{"a": {"b": 1}}`` -> ``{"a.b": 1}``)."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, Mapping) and value:
            out |= flatten(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


class MlflowTracker:
    """An MLflow run, through `mlflow.MlflowClient` (no process-global active run; see the module docstring)."""

    def __init__(self, client: Any, run_id: str, location: str):
        """Wrap a client and a started run; open one with `MlflowTracker.open`."""
        self.client, self.run_id, self.location = client, run_id, location

    @classmethod
    def open(cls, settings: TrackerSettings) -> MlflowTracker:
        """Start (or, with `settings.run_id`, continue) a run in experiment `settings.project`."""
        os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
        uri = os.environ.get("MLFLOW_TRACKING_URI") or (settings.run_dir / "mlruns").resolve().as_uri()
        if uri.startswith("file:"):
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow import MlflowClient

        client = MlflowClient(tracking_uri=uri)
        if settings.run_id:
            client.update_run(settings.run_id, status="RUNNING")
            run_id = settings.run_id
        else:
            experiment = client.get_experiment_by_name(settings.project)
            experiment_id = (experiment.experiment_id if experiment is not None
                             else client.create_experiment(settings.project))
            run_id = client.create_run(experiment_id, run_name=settings.run_name).info.run_id
        return cls(client, run_id, f"run {run_id} in {uri}")

    def log_config(self, config: Mapping[str, Any]) -> None:
        """Params (dotted keys) and ``config.json``; a resumed run keeps its params (MLflow forbids changing one)."""
        from mlflow.entities import Param
        from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH, MAX_PARAMS_TAGS_PER_BATCH

        logged = self.client.get_run(self.run_id).data.params
        params = [Param(k, json.dumps(v) if not isinstance(v, str) else v)
                  for k, v in flatten(config).items() if k not in logged]
        params = [Param(p.key, p.value[:MAX_PARAM_VAL_LENGTH]) for p in params]
        for i in range(0, len(params), MAX_PARAMS_TAGS_PER_BATCH):
            self.client.log_batch(self.run_id, params=params[i : i + MAX_PARAMS_TAGS_PER_BATCH])
        self.client.log_dict(self.run_id, dict(config), "config.json")

    def log_metrics(self, step: int, row: Mapping[str, float]) -> None:
        """One batch of metrics at `step`."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, step) for k, v in row.items()])

    def log_table(self, name: str, step: int, table: Table) -> None:
        """A JSON artifact in MLflow's table layout at ``<name>/step_<step>.json``."""
        self.client.log_dict(self.run_id, {"columns": list(table.columns), "data": [list(r) for r in table.rows]},
                             f"{name}/step_{step:06d}.json")

    def log_eval(self, step: int, summary: Mapping[str, float]) -> None:
        """The eval numbers as metrics at `step`."""
        self.log_metrics(step, summary)

    def close(self) -> None:
        """Mark the run finished."""
        self.client.set_terminated(self.run_id)
