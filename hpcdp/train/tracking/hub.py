"""The Reporter's one handle on a run's trackers (rank 0 only; no tracker, no handle).

Each tracker gets its own buffer and process (hpcdp.train.tracking.process): a record
goes to a tracker once a checkpoint covers its step, or at the normal end of the run
(records.CommitBuffer), so a resumed run never sends a step twice.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hpcdp.config import Config
from hpcdp.train.tracking import state
from hpcdp.train.tracking.mlflow_run import MlflowSink, artifact_root, store_uri
from hpcdp.train.tracking.process import TrackerProcess, child_environment
from hpcdp.train.tracking.records import CommitBuffer, Record
from hpcdp.train.tracking.wandb_run import WandbSink

log = logging.getLogger("hpcdp.train.tracking")

#: The variable that points a sweep's array task at its sweep file (hpcdp.cluster.sweep,
#: which train/ must not import); its run folder is task-<i> in the sweep folder.
SWEEP_ENV = "HPCDP_SWEEP"


def group_of(configured: str, run_dir: Path, environ: Mapping[str, str]) -> str:
    """run.tracker_group, else the sweep's folder name in a sweep's array task, else
    array-<job id> in another array task, else none (pure)."""
    if configured:
        return configured
    if environ.get(SWEEP_ENV):
        return run_dir.resolve().parent.name
    if environ.get("SLURM_ARRAY_JOB_ID"):
        return f"array-{environ['SLURM_ARRAY_JOB_ID']}"
    return ""


def sink_spec(name: str, cfg: Config, environ: Mapping[str, str]) -> dict[str, Any]:
    """How the tracker's process builds its sink: {"factory": "module:Class", "args"}
    (plain data, pure)."""
    run, run_dir = cfg.run, cfg.run_dir
    group = group_of(run.tracker_group, run_dir, environ)
    if name == "mlflow":
        uri = store_uri(run.mlflow_uri, environ, run_dir)
        return {"factory": f"{MlflowSink.__module__}:MlflowSink", "args": {
            "uri": uri, "artifact_root": artifact_root(uri, run_dir),
            "experiment": run.tracker_project, "run_name": run_dir.resolve().name,
            "group": group, "config": cfg.to_dict(),
            "connect_timeout_s": run.tracker_connect_timeout_s}}
    if name == "wandb":
        return {"factory": f"{WandbSink.__module__}:WandbSink", "args": {
            "folder": str(run_dir / state.FOLDER), "project": run.tracker_project,
            "run_name": run_dir.resolve().name, "group": group, "config": cfg.to_dict(),
            "mode": environ.get("WANDB_MODE", "")}}
    raise ValueError(f"no tracker {name!r}")  # config.validate names the known ones


def remembered(run_dir: Path, name: str, resumed: bool) -> state.TrackerState:
    """The tracker run to continue: the run folder's on a resume, none on a fresh start
    (a fresh start in an old folder is a new run, not a continuation)."""
    if not resumed:
        return state.TrackerState()
    try:
        return state.read(run_dir, name)
    except (OSError, ValueError) as e:
        log.warning(f"tracker {name}: {state.path(run_dir, name)} is unreadable ({e}); "
                    "a new tracker run starts")
        return state.TrackerState()


def export_model(checkpoint: str | None, out: Path, timeout_s: float) -> Path | None:
    """`hpcdp export` of the run's last checkpoint into `out`, in a process of its own
    (bounded by `timeout_s`); None, with a warning, when it cannot be made."""
    if not checkpoint:
        log.warning("run.tracker_model: the run wrote no checkpoint, so no model goes to the "
                    "trackers")
        return None
    command = [sys.executable, "-m", "hpcdp", "export", checkpoint, "--out", str(out)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s,
                              env=child_environment(os.environ))
    except (OSError, subprocess.TimeoutExpired) as e:
        log.warning(f"run.tracker_model: the export of {checkpoint} failed ({e}); no model "
                    "goes to the trackers")
        return None
    if done.returncode != 0:
        why = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no message"]
        log.warning(f"run.tracker_model: the export of {checkpoint} failed ({why[0]}); no "
                    "model goes to the trackers")
        return None
    return out


class Trackers:
    """Records in, to every tracker of the run, each in its own process."""

    def __init__(self, workers: list[TrackerProcess], close_timeout_s: float,
                 model_folder: Path | None = None) -> None:
        """`model_folder`: where the finished run's model is exported for the trackers
        (run.tracker_model), or None."""
        self.workers = workers
        self.buffers = [CommitBuffer(w.known.sent) for w in workers]
        self.close_timeout_s = close_timeout_s
        self.model_folder = model_folder

    @classmethod
    def start(cls, cfg: Config, resumed_step: int | None,
              environ: Mapping[str, str]) -> Trackers | None:
        """The run's trackers, each in its own process; `resumed_step`: the step of the
        checkpoint resumed, None on a fresh start."""
        if not cfg.run.trackers:
            return None
        missed = None
        if resumed_step is not None and cfg.log.jsonl:
            missed = (cfg.run_dir / "metrics.jsonl", resumed_step)
        timeout = cfg.run.tracker_close_timeout_s
        workers = [TrackerProcess(name, sink_spec(name, cfg, environ), cfg.run_dir,
                                  remembered(cfg.run_dir, name, resumed_step is not None),
                                  missed, timeout)
                   for name in cfg.run.trackers]
        return cls(workers, timeout, cfg.run_dir / "model" if cfg.run.tracker_model else None)

    def record(self, kind: str, step: int, values: Mapping[str, Any], when: float) -> None:
        for buffer in self.buffers:
            buffer.add(Record(kind, step, dict(values), when))

    def committed(self, step: int) -> None:
        """A checkpoint of `step` is written: what it covers can never be trained again."""
        for worker, buffer in zip(self.workers, self.buffers):
            worker.send(buffer.commit(step))

    def end(self, summary: Mapping[str, Any] | None, stopped: str | None) -> None:
        """The run finished (`summary`: everything held goes out), or stopped (what no
        checkpoint covers is dropped: the resumed run trains and sends it again)."""
        model = None
        if not stopped and summary and self.model_folder is not None:
            model = export_model(summary.get("checkpoint"), self.model_folder,
                                 self.close_timeout_s)
        for worker, buffer in zip(self.workers, self.buffers):
            if stopped:
                buffer.drop()
            else:
                worker.send(buffer.release_all())
            if model is not None:
                worker.model(model)
            worker.finish(summary, stopped)

    def close(self) -> None:
        """Wait for the trackers, all of them together at most run.tracker_close_timeout_s."""
        deadline = time.monotonic() + self.close_timeout_s
        for worker in self.workers:
            worker.close(max(deadline - time.monotonic(), 0.0))
