"""slurm/train.sbatch's shell logic with stand-ins for srun and scontrol (no Slurm needed).

The real script runs under bash with a PATH whose `srun` and `scontrol` are small
scripts: they record what they were given and do what a test arranges (exit with a
status, signal the batch shell just before exiting, refuse a requeue). What needs
real Slurm (placement, export to the steps, requeue) is in tests/slurm.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hpcdp.runtime.preempt import EXIT_REQUEUE

REPO = Path(__file__).resolve().parents[2]
TRAIN_SBATCH = REPO / "slurm" / "train.sbatch"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="bash not installed")

# srun stand-in: records its arguments and environment, then does what SRUN_DOES says.
SRUN = """#!/bin/bash
printf '%s\\n' "$@" > "$STANDIN/srun.args"
env > "$STANDIN/srun.env"
does="${SRUN_DOES:-exit0}"
case "$does" in
  term-then-exit7) kill -TERM "$PPID"; exit 7 ;;
  exit*) exit "${does#exit}" ;;
esac
"""
# scontrol stand-in: `show job` prints SHOW; `requeue` appends its id and exits REQUEUE_RC.
SCONTROL = """#!/bin/bash
if [[ "$1" == show ]]; then echo "${SHOW:-JobId=1 JobState=RUNNING Reason=None}"; exit 0; fi
if [[ "$1" == requeue ]]; then echo "$2" >> "$STANDIN/requeued"; exit "${REQUEUE_RC:-0}"; fi
exit 1
"""


def run_script(tmp_path: Path, env: dict[str, str], *args: str) -> tuple[int, str, Path]:
    """Run slurm/train.sbatch with the stand-ins first on PATH; (status, output, their dir)."""
    standin = tmp_path / "bin"
    standin.mkdir(exist_ok=True)
    for name, text in (("srun", SRUN), ("scontrol", SCONTROL)):
        (standin / name).write_text(text)
        (standin / name).chmod(0o755)
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("SLURM_", "OMP_", "MKL_", "HPCDP_"))}
    # The batch shell works out the layout with python3 (hpcdp.cluster.layout): this
    # venv's, as HPCDP_VENV makes it in a job.
    path = os.pathsep.join((str(standin), str(Path(sys.executable).parent), os.environ["PATH"]))
    base.update({"PATH": path, "STANDIN": str(standin)})
    done = subprocess.run(["bash", str(TRAIN_SBATCH), *args], env={**base, **env},
                          capture_output=True, text=True, timeout=60, check=False)
    return done.returncode, done.stdout + done.stderr, standin


def srun_env(standin: Path) -> dict[str, str]:
    lines = (standin / "srun.env").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line)


def test_term_as_srun_exits_keeps_sruns_status(tmp_path: Path) -> None:
    """A TERM that cuts `wait` short as srun exits must not replace srun's status by 143."""
    for _ in range(3):  # the race is arranged, not left to chance; still, three tries
        status, out, _ = run_script(tmp_path, {"SRUN_DOES": "term-then-exit7"})
        assert "batch shell got TERM" in out, out
        assert status == 7, out
        assert "ranks finished with exit status 7" in out


def test_requeue_from_the_batch_shell_names_the_array_task(tmp_path: Path) -> None:
    env = {"SRUN_DOES": f"exit{EXIT_REQUEUE}", "SLURM_JOB_ID": "41",
           "SLURM_ARRAY_JOB_ID": "40", "SLURM_ARRAY_TASK_ID": "1"}
    status, out, standin = run_script(tmp_path, env)
    assert status == 0, out
    assert (standin / "requeued").read_text().split() == ["40_1"]
    assert "requeued job 40_1 from the batch shell" in out


def test_batch_shell_requeue_refused_or_cancelled_fails(tmp_path: Path) -> None:
    env = {"SRUN_DOES": f"exit{EXIT_REQUEUE}", "SLURM_JOB_ID": "7", "REQUEUE_RC": "1"}
    status, out, standin = run_script(tmp_path, env)
    assert status == EXIT_REQUEUE, out
    assert "scontrol requeue 7 failed: the training is unfinished" in out
    # A job its user is cancelling stays cancelled: no requeue is even tried.
    (standin / "requeued").unlink()
    env.update(REQUEUE_RC="0", SHOW="JobId=7 JobState=COMPLETING Reason=None")
    status, out, standin = run_script(tmp_path, env)
    assert status == EXIT_REQUEUE, out
    assert not (standin / "requeued").exists()
    assert "is being cancelled: not requeued" in out
    # Other statuses pass through untouched, with no requeue.
    status, out, standin = run_script(tmp_path, {"SRUN_DOES": "exit3", "SLURM_JOB_ID": "7"})
    assert status == 3 and not (standin / "requeued").exists(), out


def test_steps_get_the_whole_environment_and_the_sites_mpi(tmp_path: Path) -> None:
    status, out, standin = run_script(tmp_path, {"SLURM_EXPORT_ENV": "NONE"})
    assert status == 0, out
    env = srun_env(standin)
    assert env["SLURM_EXPORT_ENV"] == "ALL"  # whatever sbatch's --export said
    args = (standin / "srun.args").read_text().splitlines()
    assert not any(a.startswith("--mpi") for a in args), args  # the site's MpiDefault
    status, out, standin = run_script(tmp_path, {"HPCDP_SRUN_MPI": "pmi2"})
    assert "--mpi=pmi2" in (standin / "srun.args").read_text().splitlines()


def test_threads_are_left_to_the_ranks(tmp_path: Path) -> None:
    """No OMP_NUM_THREADS from the node's CPU count (hardware threads with SMT)."""
    env = {"SLURM_CPUS_ON_NODE": "16", "SLURM_JOB_CPUS_PER_NODE": "16", "SLURM_NTASKS": "2",
           "SLURM_TASKS_PER_NODE": "2"}
    status, out, standin = run_script(tmp_path, env)
    assert status == 0, out
    assert "OMP_NUM_THREADS" not in srun_env(standin)
    assert "MKL_NUM_THREADS" not in srun_env(standin)
    assert "--cpus-per-task=8" in (standin / "srun.args").read_text().splitlines()
    status, out, standin = run_script(tmp_path, {**env, "OMP_NUM_THREADS": "3"})
    assert srun_env(standin)["OMP_NUM_THREADS"] == "3"  # an exported value still wins


@pytest.mark.parametrize(
    ("env", "want"),
    [
        # Two CPU-only nodes of different sizes: the smaller one decides.
        ({"SLURM_JOB_NUM_NODES": "2", "SLURM_NTASKS": "4", "SLURM_TASKS_PER_NODE": "2(x2)",
          "SLURM_JOB_CPUS_PER_NODE": "8,4", "SLURM_CPUS_ON_NODE": "8"},
         ["--ntasks=4", "--cpus-per-task=2"]),
        # Uneven tasks: 3 on a 6-CPU node, 1 on a 6-CPU node -> 2 each.
        ({"SLURM_JOB_NUM_NODES": "2", "SLURM_NTASKS": "4", "SLURM_TASKS_PER_NODE": "3,1",
          "SLURM_JOB_CPUS_PER_NODE": "6(x2)", "SLURM_CPUS_ON_NODE": "6"},
         ["--ntasks=4", "--cpus-per-task=2"]),
        # GPUs per task: the job's tasks, not one per GPU of the batch node.
        ({"SLURM_JOB_NUM_NODES": "2", "SLURM_NTASKS": "3", "SLURM_TASKS_PER_NODE": "2,1",
          "SLURM_GPUS_PER_TASK": "1", "SLURM_GPUS_ON_NODE": "2",
          "SLURM_JOB_CPUS_PER_NODE": "4,2"}, ["--ntasks=3", "--cpus-per-task=2"]),
        # --gpus-per-node: one rank per GPU on every node.
        ({"SLURM_JOB_NUM_NODES": "2", "SLURM_GPUS_ON_NODE": "4", "SLURM_GPUS_PER_NODE": "4",
          "SLURM_JOB_CPUS_PER_NODE": "32(x2)"},
         ["--ntasks=8", "--ntasks-per-node=4", "--cpus-per-task=8"]),
    ],
)
def test_layout_from_slurms_per_node_values(tmp_path: Path, env: dict[str, str],
                                            want: list[str]) -> None:
    status, out, standin = run_script(tmp_path, env)
    assert status == 0, out
    args = (standin / "srun.args").read_text().splitlines()
    assert [a for a in args if a.startswith(("--ntasks", "--cpus-per-task"))] == want, out
    assert "--overcommit" not in args


def test_uneven_gpus_over_nodes_are_refused(tmp_path: Path) -> None:
    env = {"SLURM_JOB_NUM_NODES": "2", "SLURM_GPUS": "3", "SLURM_GPUS_ON_NODE": "2",
           "SLURM_JOB_CPUS_PER_NODE": "4(x2)"}
    status, out, standin = run_script(tmp_path, env)
    assert status == 2, out
    assert "--gpus=3 over 2 nodes may give the nodes different GPU counts" in out
    assert not (standin / "srun.args").exists()
