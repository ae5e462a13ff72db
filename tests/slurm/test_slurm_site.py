"""What a real cluster does that a plain job does not: arrays, per-task GPU binding,
--export, the site's MPI plugin, ranks that cannot requeue, uneven layouts.

Each job checks several things, to keep the cluster's run short.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from hpcdp.runtime.preempt import EXIT_REQUEUE, EXIT_STOPPED
from hpcdp.train import checkpoint_folder as ckfolder

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
TRAIN_SBATCH = REPO / "slurm" / "train.sbatch"
CONFIG = REPO / "hpcdp" / "configs" / "digits.toml"
#: The venv the tests run in (make test's VENV), which the jobs on the local cluster use.
VENV = Path(sys.prefix)
Cluster = Any  # tests/slurm/conftest.py's Cluster, reached through the fixture
Job = Any


@pytest.fixture
def data(digits: tuple[Job, Path]) -> Path:
    return digits[1]


def train_args(run_dir: str | Path, data: Path, steps: int, *extra: str) -> list[str]:
    return ["--config", str(CONFIG), f"run.dir={run_dir}", f"data.path={data}",
            "run.epochs=1000", f"run.max_steps={steps}", "log.every_steps=1",
            "log.tensorboard=false", "log.progress=false", "checkpoint.every_steps=100000",
            *extra]


def steps_done(run_dir: Path, after: int = 0) -> int:
    """The last training step in metrics.jsonl that is beyond `after` (0 if none yet)."""
    path = run_dir / "metrics.jsonl"
    last = 0
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line being written
        if record.get("kind") == "train":
            last = int(record["step"])
    return last if last > after else 0


def signal_when(job: Job, cluster: Cluster, run_dir: Path, step: int, after: int = 0) -> None:
    """USR1 to the ranks (as --signal=USR1@lead sends it) once training passed `step`."""
    job.wait_for(f"step {step} in {run_dir}", lambda: steps_done(run_dir, after) >= step,
                 timeout=180)
    sent = cluster.run("scancel", "--signal=USR1", job.id)
    assert sent.returncode == 0, sent.stderr


def test_array_task_requeues_alone_with_export_and_the_sites_mpi(
        slurm_cluster: Cluster, data: Path, tmp_path: Path) -> None:
    """`--array=0-1` with `--export=VARS` (no ALL); USR1 to one task only.

    The task signalled is the one whose JobId is the array's own id, which
    `scontrol requeue $SLURM_JOB_ID` would requeue with every other task. It is
    requeued and completes; the other never restarts; each has its own run dir from
    one `run.dir=.../r_${SLURM_ARRAY_TASK_ID}`; the steps got the venv (one world of
    2 ranks per task) and srun was given no --mpi (the cluster's MpiDefault=pmix).
    """
    runs = tmp_path / "runs"
    # Every rank pauses 20 s at step 6: on a quiet machine the 30 steps take about a
    # second, and the signal must reach a running task.
    export = (f"--export=HPCDP_VENV={VENV},PYTHONPATH={REPO},OMP_NUM_THREADS=1,"
              "HPCDP_FAULT=stall:step=6:seconds=20")
    array = slurm_cluster.sbatch(
        "--array=0-1", "--ntasks=2", export, f"--output={tmp_path}/arr-%A_%a.out",
        str(TRAIN_SBATCH), *train_args(runs / "r_${SLURM_ARRAY_TASK_ID}", data, 30),
        cwd=tmp_path)
    tasks = [slurm_cluster.job(f"{array.id}_{i}", tmp_path) for i in (0, 1)]
    # While pending, both tasks are the array's record; once running, one keeps its id.
    for task in tasks:
        task.wait_for("the task to start", lambda t=task: t.info()["JobState"] == "RUNNING",
                      timeout=60)
    carrier = next(i for i, t in enumerate(tasks) if t.info()["JobId"] == array.id)
    hit, other = tasks[carrier], tasks[1 - carrier]
    signal_when(hit, slurm_cluster, runs / f"r_{carrier}", 3)
    info_hit, info_other = hit.wait(timeout=240), other.wait(timeout=120)
    assert info_hit["Restarts"] == "1", hit.describe()
    assert info_other["Restarts"] == "0", f"requeued with the other task\n{other.describe()}"
    assert f"requeued job {array.id}_{carrier}" in hit.output(), hit.describe()
    for i, task in enumerate(tasks):
        summary = json.loads((runs / f"r_{i}" / "summary.json").read_text())
        assert summary["steps"] == 30 and summary["world_size"] == 2, task.describe()
        assert bool(summary["resumed_from"]) == (i == carrier), summary
        ranks = task.rank_lines()
        assert ranks and all(r["size"] == 2 for r in ranks), task.describe()
        srun_line = next(x for x in task.output().splitlines() if "] srun " in x)
        assert "--mpi" not in srun_line, srun_line


def test_ranks_without_scontrol_leave_the_requeue_to_the_batch_shell_and_the_cap_holds(
        slurm_cluster: Cluster, data: Path, tmp_path: Path) -> None:
    """As inside a container: the ranks' PATH has no scontrol.

    First USR1: the ranks checkpoint and exit 75, the batch shell requeues the job.
    Second USR1 after the restart: preempt.max_requeues=1 is reached, so the job
    fails with 76 instead of reading COMPLETED on unfinished training.
    """
    python = tmp_path / "python-in-container"
    python.write_text(f"#!/bin/bash\nexport PATH={VENV}/bin\nexec {VENV}/bin/python \"$@\"\n")
    python.chmod(0o755)
    run = tmp_path / "run"
    # Only the signals end this job: a quiet machine runs a few hundred digits steps in a
    # second (the restart once finished 200 before the second USR1 reached it).
    job = slurm_cluster.sbatch("--ntasks=2", str(TRAIN_SBATCH),
                               *train_args(run, data, 20000, "preempt.max_requeues=1"),
                               cwd=tmp_path, env={"HPCDP_PYTHON": str(python)})
    signal_when(job, slurm_cluster, run, 3)
    job.wait_for("the restart", lambda: "(restart 1)" in job.output(), timeout=120)
    first = ckfolder.list_checkpoints(run / "checkpoints")[0][0]
    signal_when(job, slurm_cluster, run, first + 2, after=first)
    info = job.wait(timeout=120, states=("FAILED",))
    text = job.output()
    assert info["Restarts"] == "1" and info["ExitCode"] == f"{EXIT_STOPPED}:0", job.describe()
    assert f"exit {EXIT_REQUEUE} asks the batch script" in text, job.describe()
    assert f"ranks finished with exit status {EXIT_REQUEUE}" in text
    assert f"requeued job {job.id} from the batch shell" in text
    assert "requeued 1 time(s) already, preempt.max_requeues=1" in text
    assert f"ranks finished with exit status {EXIT_STOPPED}" in text
    assert not (run / "summary.json").exists()
    assert ckfolder.list_checkpoints(run / "checkpoints")[0][0] > first
    assert job.leftover_processes() == []


def test_per_task_gpu_binding_and_uneven_gpus(slurm_cluster: Cluster, data: Path,
                                              tmp_path: Path) -> None:
    """--gpus-per-task=1 and --gpu-bind=map_gpu:1,0: each rank sees one GPU and uses it
    (the old index-by-local-rank killed local rank 1). --gpus=3 over 2 nodes: refused."""
    uneven = slurm_cluster.sbatch("--nodes=2", "--gpus=3", str(TRAIN_SBATCH),
                                  *train_args(tmp_path / "u", data, 2), cwd=tmp_path)
    uneven.wait(timeout=60, states=("FAILED",))
    assert "--gpus=3 over 2 nodes may give the nodes different GPU counts" in uneven.output()
    per_task = slurm_cluster.sbatch("--ntasks=2", "--gpus-per-task=1", str(TRAIN_SBATCH),
                                    *train_args(tmp_path / "a", data, 2), cwd=tmp_path)
    mapped = slurm_cluster.sbatch("--ntasks=2", "--gpus=2", "--gpu-bind=map_gpu:1,0",
                                  str(TRAIN_SBATCH), *train_args(tmp_path / "b", data, 2),
                                  cwd=tmp_path)
    for job in (per_task, mapped):
        job.wait(timeout=240)
    ranks = sorted(per_task.rank_lines(), key=lambda r: r["rank"])
    assert [(r["cuda_visible_devices"], r["gpu"]) for r in ranks] == [("0", "0"), ("1", "1")]
    ranks = sorted(mapped.rank_lines(), key=lambda r: r["rank"])
    assert [(r["local_rank"], r["gpu"]) for r in ranks] == [(0, "1"), (1, "0")], mapped.describe()


def test_world_of_one_under_several_tasks_stops_at_once(data: Path, tmp_path: Path) -> None:
    """What each task of `srun --ntasks=2` sees under an MPI plugin that does not fit.

    With Open MPI 4, `--mpi=none` makes Open MPI abort by itself; a plugin that starts
    singletons (pmi2 with Open MPI 5) leaves every task rank 0 of a world of 1. Two
    processes with a Slurm step's variables and no launcher are exactly that.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OMPI_", "PMIX_"))}
    env.update(SLURM_STEP_NUM_TASKS="2", SLURM_MPI_TYPE="pmi2", OMP_NUM_THREADS="1",
               PYTHONPATH=str(REPO))
    cmd = [sys.executable, "-m", "hpcdp.train", *train_args(tmp_path / "run", data, 2)]
    start = time.monotonic()
    procs = [subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    for p, out in zip(procs, outs):
        assert p.returncode == 2, out
        assert re.search(r"srun started 2 tasks but each is a world of 1 rank.*--mpi=pmi2",
                         out), out
    assert time.monotonic() - start < 120
    assert not (tmp_path / "run").exists()  # stopped before anything was written
