"""MLflowLogger: a run's rows as metrics of an MLflow run, which a resume continues.

The tracking server is ``tracking_uri`` when given, else MLflow's own choice (the
``MLFLOW_TRACKING_URI`` environment variable, else its default store); the experiment is
``experiment_name``, else ``MLFLOW_EXPERIMENT_NAME``, else ``"nitro"``. The MLflow run's id,
experiment and tracking URI are kept in every record, so a resume logs to the same MLflow
run on the same server (:mod:`nitro_core.training.trackers` says how no step is sent twice,
and what happens when the server does not answer). At setup, a tracking server (an
``http(s)://`` URI) is asked for any answer within ``NITRO_TRACKER_TIMEOUT_S``; a local
store (``sqlite:``, a directory) has none to ask. ``mlflow`` is imported when the first row
is sent, never at import or setup.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any
from urllib.parse import urlsplit

from nitro_core.training.tracker_calls import unreachable
from nitro_core.training.trackers import TrackerLogger, Unanswered, require

DEFAULT_EXPERIMENT = "nitro"


class MLflowLogger(TrackerLogger):
    """Metrics of one MLflow run per Nitro run, at the row's optimizer ``step``
    (``train_loss``, ``lr``, ``seconds``, ``epoch``, ``val/<metric>``), the JSONL log too.
    ``params`` (e.g. the experiment's config) are logged once, when the MLflow run is
    created; its name is the Nitro run id. Needs ``pip install 'nitro[mlflow]'``."""

    backend = "mlflow"
    tracker = "MLflow"
    id_key = "run_id"

    def _load(self) -> None:
        import mlflow.entities  # noqa: F401
        import mlflow.tracking  # noqa: F401

    def __init__(
        self,
        tracking_uri: str | None = None,
        experiment_name: str | None = None,
        params: dict[str, Any] | None = None,
    ) -> None:
        require("mlflow", "MLflowLogger", "mlflow", "mlflow>=2.14")  # refused at setup
        super().__init__(params)
        self.tracking_uri = tracking_uri
        self.experiment_name = experiment_name
        self._client: Any = None
        self._uri: str | None = None  # where a new MLflow run goes (None: MLflow's default)

    def _check(self, ids: dict[str, Any] | None) -> Unanswered | None:
        self._uri = self.tracking_uri or _configured_uri()
        uri = ids["tracking_uri"] if ids else self._uri
        if uri is None or urlsplit(uri).scheme not in ("http", "https"):
            return None  # a local store: nothing to ask
        why = unreachable(f"{uri.rstrip('/')}/health", self._seconds)
        if why is None:
            return None
        return Unanswered(
            f"cannot reach the MLflow tracking server at {uri}: {why}",
            "Start the server, or point MLFLOW_TRACKING_URI (or MLflowLogger(tracking_uri=...)) "
            "at one that answers",
        )

    def _where(self) -> str:
        uri = self.ids["tracking_uri"] if self.ids else self._uri
        return f"at {uri}" if uri else "(its default store)"

    def _start(self, ids: dict[str, Any] | None) -> dict[str, Any]:
        from mlflow.tracking import MlflowClient, get_tracking_uri  # lazy: a heavy import

        if ids is not None:  # continue the recorded run, where it was recorded
            self._client = MlflowClient(tracking_uri=ids["tracking_uri"])
            self._client.update_run(ids["run_id"], status="RUNNING")
            return ids
        uri = self._uri or get_tracking_uri()
        client = self._client = MlflowClient(tracking_uri=uri)
        name = (
            self.experiment_name or os.environ.get("MLFLOW_EXPERIMENT_NAME") or DEFAULT_EXPERIMENT
        )
        found = client.get_experiment_by_name(name)
        experiment_id = found.experiment_id if found else client.create_experiment(name)
        run = client.create_run(
            experiment_id,
            run_name=self.run_id,
            tags={"nitro.run_id": str(self.run_id), "nitro.run_dir": str(self.run_dir)},
        )
        run_id = run.info.run_id
        for key, value in self.params.items():
            client.log_param(run_id, key, value)
        return {"run_id": run_id, "experiment_id": experiment_id, "tracking_uri": uri}

    def _held_step(self) -> int:
        assert self.ids is not None  # a continued run
        history = self._client.get_metric_history(self.ids["run_id"], "epoch")  # every row's
        return max((m.step for m in history), default=-1)

    def _send(self, values: list[tuple[str, float]], step: int) -> None:
        from mlflow.entities import Metric  # lazy

        assert self.ids is not None
        now = int(time.time() * 1000)
        metrics = [Metric(tag, value, now, step) for tag, value in values]
        self._client.log_batch(self.ids["run_id"], metrics=metrics, synchronous=True)

    def _finish(self) -> None:
        assert self.ids is not None
        self._client.set_terminated(self.ids["run_id"], status="FINISHED")
        self._client = None


def _configured_uri() -> str | None:
    """The tracking URI MLflow would use, without importing it: ``mlflow.set_tracking_uri``
    can only have been called once ``mlflow`` is imported; before, only the environment
    names one (else MLflow's default, a local store)."""
    mlflow = sys.modules.get("mlflow")
    if mlflow is not None:
        return str(mlflow.get_tracking_uri())
    return os.environ.get("MLFLOW_TRACKING_URI") or None
