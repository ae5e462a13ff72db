"""MLflow: the run's config as parameters, its records as metrics, one MLflow run per run
folder (`hpcdp[mlflow]`).

The store is `run.mlflow_uri`, else MLFLOW_TRACKING_URI, else an SQLite file in the run
folder (trackers/mlflow.db), which works offline and is read by `mlflow ui
--backend-store-uri sqlite:///...`. Only MlflowClient is used, never mlflow's active
run: the calls run in the tracker's own process (hpcdp.train.tracking.child).
"""

from __future__ import annotations

import logging
import os
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hpcdp.train.tracking import state
from hpcdp.train.tracking.records import Record, flat_params, numbers, scalars

#: MLflow's own limits on one log_batch call and on a parameter's value.
PARAMS_PER_BATCH, METRICS_PER_BATCH, PARAM_VALUE_CHARS = 100, 1000, 6000
GROUP_TAG = "hpcdp.group"


def artifact_root(uri: str, run_dir: Path) -> str:
    """The run folder's trackers/mlflow-artifacts for the run folder's own store; else
    empty (a server or a user's store keeps its own)."""
    if uri == store_uri("", {}, run_dir):
        return (run_dir / state.FOLDER / "mlflow-artifacts").resolve().as_uri()
    return ""


def store_uri(configured: str, environ: Mapping[str, str], run_dir: Path) -> str:
    """run.mlflow_uri, else MLFLOW_TRACKING_URI, else the run folder's SQLite store (pure)."""
    if configured:
        return configured
    if environ.get("MLFLOW_TRACKING_URI"):
        return environ["MLFLOW_TRACKING_URI"]
    return f"sqlite:///{(run_dir / state.FOLDER / 'mlflow.db').resolve()}"


def chunks(items: list[Any], size: int) -> list[list[Any]]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def check_server(uri: str, timeout_s: float) -> None:
    """ConnectionError unless the server answers its health check within `timeout_s`.

    Any HTTP answer will do (a proxy's 401 included): the check is there because MLflow's
    client retries a server that refuses, or waits on one that never answers, for
    minutes per call, and the run's close would wait for it.
    """
    try:
        with urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=timeout_s):
            pass
    except urllib.error.HTTPError:
        pass
    except (OSError, ValueError) as e:  # URLError, a timeout, a refused connection
        reason = getattr(e, "reason", e)
        raise ConnectionError(f"the MLflow server {uri} did not answer within {timeout_s:g} s "
                              f"(run.tracker_connect_timeout_s): {reason}") from e


class MlflowSink:
    name = "mlflow"

    def __init__(self, uri: str, experiment: str, run_name: str, group: str,
                 config: Mapping[str, Any], connect_timeout_s: float = 5.0,
                 artifact_root: str = "") -> None:
        """`artifact_root`: where a new experiment keeps its files (empty: the store's
        default, which for a local store is ./mlruns in the working directory)."""
        self.uri, self.experiment, self.run_name, self.group = uri, experiment, run_name, group
        self.connect_timeout_s, self.artifact_root = connect_timeout_s, artifact_root
        self.params = flat_params(config)
        self.client: Any = None
        self.run_id = ""

    def open(self, run_id: str | None) -> str:
        """The MLflow run of `run_id` when the store still has it, else a new one."""
        if self.uri.startswith(("http://", "https://")):
            check_server(self.uri, self.connect_timeout_s)
        from mlflow.tracking import MlflowClient  # ~1.5 s of imports, on this thread

        for noisy in ("mlflow", "alembic"):  # the SQLite store's "creating tables" lines
            logging.getLogger(noisy).setLevel(logging.WARNING)
        # Nor a "View run at" line on stdout (a server's runs) for each segment's end:
        # the job's log is hpcdp's. Exporting it false brings the line back.
        os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
        if self.uri.startswith("sqlite:///"):
            Path(self.uri[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
        self.client = MlflowClient(tracking_uri=self.uri)
        held = self._existing(run_id) if run_id is not None else None
        if held is None:
            tags = {GROUP_TAG: self.group} if self.group else {}
            run = self.client.create_run(self._experiment_id(), run_name=self.run_name,
                                         tags=tags)
            self.run_id, held = run.info.run_id, {}
        else:
            self.run_id = str(run_id)
            self.client.update_run(self.run_id, status="RUNNING")
        self._log_params({k: v for k, v in self.params.items() if k not in held})
        return self.run_id

    def log(self, records: list[Record]) -> list[Record]:
        """Stored when log_batch returns: all of them."""
        from mlflow.entities import Metric

        metrics = [Metric(key, value, int(r.time * 1000) or int(time.time() * 1000), r.step)
                   for r in records for key, value in numbers(r).items()]
        for part in chunks(metrics, METRICS_PER_BATCH):
            self.client.log_batch(self.run_id, metrics=part)
        return records

    def finish(self, summary: Mapping[str, Any] | None, stopped: str | None) -> None:
        from mlflow.entities import Metric, RunTag

        if summary is not None:
            values = scalars(summary)
            step, now = int(summary.get("steps", 0)), int(time.time() * 1000)
            metrics = [Metric(f"summary/{k}", float(v), now, step) for k, v in values.items()
                       if not isinstance(v, str)]
            tags = [RunTag(f"summary.{k}", v) for k, v in values.items() if isinstance(v, str)]
            self.client.log_batch(self.run_id, metrics=metrics, tags=tags)
        if stopped:
            self.client.set_tag(self.run_id, "hpcdp.stopped", stopped)
        self.client.set_terminated(self.run_id, "KILLED" if stopped else "FINISHED")

    def log_model(self, folder: Path) -> None:
        self.client.log_artifacts(self.run_id, str(folder), artifact_path="model")

    def _existing(self, run_id: str) -> dict[str, str] | None:
        """The parameters the store holds for `run_id`, or None when it has no such run."""
        from mlflow.exceptions import MlflowException

        try:
            return dict(self.client.get_run(run_id).data.params)
        except MlflowException:
            return None

    def _experiment_id(self) -> str:
        found = self.client.get_experiment_by_name(self.experiment)
        if found is not None:
            return found.experiment_id
        try:
            return self.client.create_experiment(self.experiment,
                                                 artifact_location=self.artifact_root or None)
        except Exception:  # another array task created it first (a shared server)
            found = self.client.get_experiment_by_name(self.experiment)
            if found is None:
                raise
            return found.experiment_id

    def _log_params(self, params: dict[str, str]) -> None:
        from mlflow.entities import Param

        items = [Param(k, v[:PARAM_VALUE_CHARS]) for k, v in params.items()]
        for part in chunks(items, PARAMS_PER_BATCH):
            self.client.log_batch(self.run_id, params=part)
