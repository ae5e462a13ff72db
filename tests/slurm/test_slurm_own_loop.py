"""examples/own_loop.py (a script's own loop on hpcdp.session) under the local Slurm cluster.

SIGUSR1 to one rank mid-epoch: the ranks agree to stop, rank 0 checkpoints and requeues
the job, and the requeued job resumes to final weights bitwise equal to an uninterrupted
run's. A rank stalled by HPCDP_FAULT ends the job (submitted with `hpcdp slurm submit
--script`), the watchdog naming it.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from hpcdp.runtime.stall import PREFIX
from hpcdp.train import checkpoint_folder as ckfolder
from hpcdp.train import checkpoint_format as ckformat
from hpcdp.train import checkpoint_trust as cktrust

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
TRAIN_SBATCH = REPO / "slurm" / "train.sbatch"
EXAMPLE = REPO / "examples" / "own_loop.py"
Cluster = Job = Any  # tests/slurm/conftest.py's, reached through the fixtures
# Every rank pauses 6 s before step 11, so that a signal sent once step 10's checkpoint
# is written reaches running ranks (the steps take milliseconds); within KillWait.
PAUSE_AT_11 = {"HPCDP_FAULT": "stall:step=11:seconds=6"}


def script_args(run_dir: Path, data: Path) -> list[str]:
    """train.sbatch's arguments: the example (3 epochs) with a global batch of 64, a
    checkpoint every 10 steps."""
    return ["--script", str(EXAMPLE), "--", f"data.path={data}", f"run.dir={run_dir}",
            "data.global_batch_size=64", "checkpoint.every_steps=10"]


def final_state(run_dir: Path) -> tuple[int, dict[str, Any]]:
    step, path = ckfolder.list_checkpoints(run_dir / "checkpoints")[0]
    return step, ckformat.decode(cktrust.read_verified(path), str(path))


def rank_pid(job_id: str, rank: int) -> int:
    """The pid of the script's process that is rank `rank` of the job (SLURM_PROCID)."""
    wanted = {f"SLURM_JOB_ID={job_id}".encode(), f"SLURM_PROCID={rank}".encode()}
    for proc in Path("/proc").iterdir():
        try:
            environ = set((proc / "environ").read_bytes().split(b"\0"))
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if wanted <= environ and str(EXAMPLE).encode() in cmdline and b"srun" not in cmdline:
            return int(proc.name)
    raise AssertionError(f"no rank {rank} of job {job_id} found")


def test_usr1_to_one_rank_stops_checkpoints_requeues_and_resumes_bitwise(
        slurm_cluster: Cluster, digits: tuple[Job, Path], tmp_path: Path) -> None:
    data = digits[1]
    ref = slurm_cluster.sbatch("--ntasks=2", str(TRAIN_SBATCH),
                               *script_args(tmp_path / "ref", data), cwd=tmp_path)
    run = tmp_path / "run"
    job = slurm_cluster.sbatch("--ntasks=2", str(TRAIN_SBATCH), *script_args(run, data),
                               cwd=tmp_path, env=PAUSE_AT_11)
    job.wait_for("the checkpoint of step 10",
                 lambda: (run / "checkpoints" / "step-00000010.pt").exists(), timeout=180)
    os.kill(rank_pid(job.id, 1), signal.SIGUSR1)
    info = job.wait(timeout=240)
    text = job.output()
    assert info["Restarts"] == "1", job.describe()
    m = re.search(r"preempted at step (\d+): checkpoint written to (\S+), requeued job", text)
    assert m, f"no agreed stop with a checkpoint and a requeue\n{job.describe()}"
    step, path = int(m[1]), m[2]
    assert f"resumed from {path}: step {step}, epoch 0, 2 rank(s)" in text, job.describe()
    first_run = text[text.index("(restart 0)"):text.index("(restart 1)")]
    assert "ranks finished with exit status 0" in first_run, job.describe()
    ref.wait(timeout=240)
    (ref_step, expected), (last, got) = final_state(tmp_path / "ref"), final_state(run)
    assert last == ref_step and got["epoch"] == expected["epoch"] == 3
    assert 11 <= step < ref_step // 3, job.describe()  # inside the first epoch
    differ = [k for k in expected["model"] if not torch.equal(expected["model"][k],
                                                              got["model"][k])]
    assert not differ, f"parameters differ from the uninterrupted run: {differ}"
    assert got["extra"] == expected["extra"] and got["optimizers"][0]["state"].keys()
    assert job.leftover_processes() == []


def test_a_stalled_rank_ends_the_job_named(slurm_cluster: Cluster, digits: tuple[Job, Path],
                                           tmp_path: Path) -> None:
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "hpcdp", "slurm", "submit", "--script", str(EXAMPLE),
           "--ntasks-per-node", "2", "--time", "10", "--signal-lead", "60",
           "--output", str(tmp_path / "job-%j.out"),
           "--", f"data.path={digits[1]}", f"run.dir={run}", "run.stall_floor_s=5",
           "run.stall_warmup_factor=8"]
    env = slurm_cluster.job_env({"HPCDP_FAULT": "stall:rank=1:step=5:seconds=600"})
    done = subprocess.run(cmd, env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    job = slurm_cluster.job(done.stdout.strip(), tmp_path)
    info = job.wait(timeout=180, states=("FAILED",))
    assert info["Restarts"] == "0", job.describe()  # a stall is not requeued
    text = job.output()
    assert "rank 1 stalls for 600 s at step 5" in text, job.describe()
    line = next((x for x in text.splitlines() if PREFIX in x), "")
    assert f"{PREFIX} rank 1 did not reach the point the others wait at" in line, job.describe()
    assert job.leftover_processes() == []
