"""slurm/train.sbatch end to end on the local cluster, through real sbatch.

Layout (one node, two tasks; two nodes with a GPU each; one node with two
GPUs through `hpcdp slurm submit`), preemption (USR1 -> checkpoint -> requeue
-> resume, bitwise equal to an uninterrupted run) and failing fast.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from hpcdp.train import checkpoint_folder as ckfolder
from hpcdp.train import checkpoint_format as ckformat
from hpcdp.train import checkpoint_trust as cktrust

pytestmark = pytest.mark.slurm


@pytest.fixture
def data(digits: tuple[Job, Path]) -> Path:
    return digits[1]

REPO = Path(__file__).resolve().parents[2]
TRAIN_SBATCH = REPO / "slurm" / "train.sbatch"
PREP_SBATCH = REPO / "slurm" / "prep.sbatch"
CONFIG = REPO / "hpcdp" / "configs" / "digits.toml"
Cluster = Any  # tests/slurm/conftest.py's Cluster, reached through the fixture
Job = Any
# Long enough that a signal sent after step 10 lands well before the end.
STEPS = 40
# Every rank pauses 6 s at step 11 (HPCDP_FAULT): a quiet machine trains the 40 steps
# in about a second, and a signal sent once step 10 is logged must reach running ranks;
# what is left of the pause must stay well inside the cluster's KillWait (10 s).
PAUSE_AT_11 = {"HPCDP_FAULT": "stall:step=11:seconds=6"}


def train_args(run_dir: Path, data: Path, steps: int = STEPS, *extra: str) -> list[str]:
    """Arguments for `python -m hpcdp.train`: the tiny digits model, quiet, few checkpoints."""
    return [
        "--config", str(CONFIG), f"run.dir={run_dir}", f"data.path={data}",
        "run.epochs=1000", f"run.max_steps={steps}", "log.every_steps=5",
        "log.tensorboard=false", "log.progress=false", "checkpoint.every_steps=100000",
        *extra,
    ]


def final_model(run_dir: Path) -> tuple[int, dict[str, torch.Tensor]]:
    """(step, model state dict) of the newest checkpoint in a run."""
    found = ckfolder.list_checkpoints(run_dir / "checkpoints")
    assert found, f"no checkpoint in {run_dir}"
    step, path = found[0]
    return step, ckformat.decode(cktrust.read_verified(path), str(path))["model"]


@pytest.fixture(scope="module")
def reference(slurm_cluster: Cluster, digits: tuple[Job, Path],
              tmp_path_factory: pytest.TempPathFactory) -> tuple[Job, Path]:
    """`sbatch --ntasks=2 slurm/train.sbatch ...`: one node, two tasks, uninterrupted."""
    where = tmp_path_factory.mktemp("reference")
    job = slurm_cluster.sbatch("--ntasks=2", str(TRAIN_SBATCH),
                               *train_args(where / "run", digits[1]), cwd=where)
    job.wait(timeout=240)
    return job, where / "run"


def test_one_node_two_tasks_trains_and_checkpoints(reference: tuple[Job, Path]) -> None:
    job, run = reference
    assert job.output_path.parent == job.cwd and job.output_path.name == f"hpcdp-train-{job.id}.out"
    ranks = job.rank_lines()
    assert sorted(r["rank"] for r in ranks) == [0, 1], job.describe()
    assert {r["slurm_node"] for r in ranks} == {job.info()["NodeList"]}
    assert sorted(r["local_rank"] for r in ranks) == [0, 1]
    assert all(r["size"] == 2 and r["local_size"] == 2 and r["slurm_job"] == job.id
               for r in ranks), job.describe()
    step, state = final_model(run)
    assert step == STEPS
    assert state and all(torch.isfinite(t).all() for t in state.values() if t.is_floating_point())
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == STEPS and summary["world_size"] == 2
    assert "2 ranks, 1 node(s), 0 GPU(s)/node, 1 CPU(s)/rank" in job.output()


def test_two_nodes_one_gpu_each(slurm_cluster: Cluster, data: Path, tmp_path: Path) -> None:
    job = slurm_cluster.sbatch("--nodes=2", "--gpus-per-node=1", str(TRAIN_SBATCH),
                               *train_args(tmp_path / "run", data, 4), cwd=tmp_path)
    job.wait(timeout=240)
    ranks = sorted(job.rank_lines(), key=lambda r: r["rank"])
    assert [r["rank"] for r in ranks] == [0, 1], job.describe()
    assert {r["slurm_node"] for r in ranks} == {"node1", "node2"}
    for r in ranks:
        assert r["size"] == 2 and r["local_rank"] == 0 and r["local_size"] == 1, r
        # One GPU per node, and the rank was given exactly that one.
        assert r["cuda_visible_devices"] in ("0", "1"), r
        assert r["device"] == "cpu"  # fake GPUs: torch finds no CUDA device
    assert sorted(r["cross_rank"] for r in ranks) == [0, 1]
    assert (tmp_path / "run" / "summary.json").exists()


def test_submit_one_node_two_gpus(slurm_cluster: Cluster, data: Path, tmp_path: Path) -> None:
    """`hpcdp slurm submit`: rendered options, job id printed, one distinct GPU per rank."""
    # train_args starts with --config FILE, which is also render()'s config option.
    cmd = [sys.executable, "-m", "hpcdp", "slurm", "submit", "--gpus-per-node", "2",
           "--cpus-per-task", "1", "--time", "10", "--signal-lead", "60",
           "--venv", sys.prefix, "--output", str(tmp_path / "submit-%j.out"),
           "--save", str(tmp_path / "job.sbatch"), *train_args(tmp_path / "run", data, 4)]
    done = subprocess.run(cmd, env=slurm_cluster.job_env(), cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.strip()
    assert re.fullmatch(r"\d+", job_id), done.stdout
    assert "#SBATCH --gpus-per-node=2" in (tmp_path / "job.sbatch").read_text()
    job = slurm_cluster.job(job_id, tmp_path)
    job.wait(timeout=240)
    ranks = sorted(job.rank_lines(), key=lambda r: r["rank"])
    assert [r["local_rank"] for r in ranks] == [0, 1], job.describe()
    # Both see the node's two GPUs; each takes its own (hpcdp.runtime.placement.choose_gpu).
    assert [r["cuda_visible_devices"] for r in ranks] == ["0,1", "0,1"], job.describe()
    assert [r["gpu"] for r in ranks] == ["0", "1"], job.describe()
    assert len({r["slurm_node"] for r in ranks}) == 1


def test_preempted_job_checkpoints_requeues_and_resumes_bitwise(
    slurm_cluster: Cluster, data: Path, reference: tuple[Job, Path], tmp_path: Path,
) -> None:
    """`scancel --signal=USR1` reaches the ranks as `--signal=USR1@lead` would (not B:)."""
    run = tmp_path / "run"
    job = slurm_cluster.sbatch("--ntasks=2", str(TRAIN_SBATCH), *train_args(run, data),
                               cwd=tmp_path, env=PAUSE_AT_11)
    job.wait_for_step(run, 10)
    signalled = slurm_cluster.run("scancel", "--signal=USR1", job.id)
    assert signalled.returncode == 0, signalled.stderr
    info = job.wait(timeout=240)
    text = job.output()
    assert info["Restarts"] == "1", job.describe()
    # Both runs of the job appended to the same output file.
    assert "(restart 0)" in text and "(restart 1)" in text, job.describe()
    m = re.search(r"preempted at step (\d+): checkpoint written to (\S+), requeued job", text)
    assert m, f"no preemption checkpoint + requeue reported\n{job.describe()}"
    preempted_step, preempt_ckpt = int(m[1]), m[2]
    assert 10 <= preempted_step < STEPS
    summary = json.loads((run / "summary.json").read_text())
    assert summary["resumed_from"] == preempt_ckpt
    assert f"resumed from {preempt_ckpt}" in text
    # Same final parameters as the uninterrupted run, bit for bit.
    _, ref_run = reference
    ref_step, ref_state = final_model(ref_run)
    step, state = final_model(run)
    assert step == ref_step == STEPS
    assert state.keys() == ref_state.keys()
    differ = [k for k in state if not torch.equal(state[k], ref_state[k])]
    assert not differ, f"parameters differ from the uninterrupted run: {differ}"
    assert job.leftover_processes() == []
    # Every rank of the interrupted run exited cleanly, also after the requeue's TERM.
    first_run = text[text.index("(restart 0)"):text.index("(restart 1)")]
    assert "ranks finished with exit status 0" in first_run, job.describe()


def test_broken_config_fails_fast(slurm_cluster: Cluster, data: Path, tmp_path: Path) -> None:
    job = slurm_cluster.sbatch("--ntasks=2", str(TRAIN_SBATCH),
                               *train_args(tmp_path / "run", data, 10, "optim.lr=fast"),
                               cwd=tmp_path)
    info = job.wait(timeout=120, states=("FAILED",))
    text = job.output()
    assert "optim.lr" in text and "fast" in text, job.describe()
    assert "hpcdp-rank" not in text  # refused before any rank joined a collective
    assert info["Restarts"] == "0"
    assert job.leftover_processes() == []
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_more_ranks_than_gpus_is_refused(slurm_cluster: Cluster, tmp_path: Path) -> None:
    job = slurm_cluster.sbatch("--gpus-per-node=2", "--ntasks-per-node=1", str(TRAIN_SBATCH),
                               "--config", str(CONFIG), cwd=tmp_path)
    job.wait(timeout=60, states=("FAILED",))
    assert "one rank per GPU, but --ntasks-per-node=1 differs from the 2 GPUs" in job.output()
    assert "hpcdp-rank" not in job.output()


def test_cancelled_job_checkpoints_and_stays_cancelled(slurm_cluster: Cluster, data: Path,
                                                       tmp_path: Path) -> None:
    """`scancel JOB`: TERM to the batch shell, srun and the ranks at once (as at a time limit).

    The ranks get KillWait seconds; the batch shell must not end the job before rank 0's
    checkpoint is written. Unlike a time limit or preemption, a job its user cancelled
    must not requeue itself (its state then reads CANCELLED, not TIMEOUT or PREEMPTED).
    """
    run = tmp_path / "run"
    job = slurm_cluster.sbatch("--ntasks=2", str(TRAIN_SBATCH), *train_args(run, data),
                               cwd=tmp_path,
                               env=PAUSE_AT_11)
    job.wait_for_step(run, 10)
    cancelled = slurm_cluster.run("scancel", job.id)
    assert cancelled.returncode == 0, cancelled.stderr
    # The sbatch side: the batch shell outlives the ranks, which checkpoint in time.
    job.wait_for("the end of the ranks", lambda: "ranks finished" in job.output(), timeout=120)
    text = job.output()
    m = re.search(r"preempted at step (\d+): checkpoint written to (\S+)", text)
    assert m, f"no checkpoint reported after the TERM\n{job.describe()}"
    assert 10 <= int(m[1]) <= STEPS  # the agreed stop may fall on the last step
    path = Path(m[2].rstrip(","))
    assert ckformat.decode(cktrust.read_verified(path), str(path))["step"] == int(m[1])
    # The training side: a cancelled job stays cancelled.
    info = job.wait(timeout=60, states=("CANCELLED",))
    assert info["Restarts"] == "0", f"the cancelled job requeued itself\n{job.describe()}"
    assert job.leftover_processes() == []
