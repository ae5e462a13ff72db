"""A job on a node range (`hpcdp slurm submit --nodes 1-2`) on the local cluster.

Uninterrupted, it runs on both nodes. Preempted while node2 is drained, it is
requeued onto node1 alone and resumes there on half the ranks: the same steps,
samples and peak learning rate as the uninterrupted run, because the global
batch is fixed (hpcdp.cluster.node_range refuses a range without one).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "hpcdp" / "configs" / "digits.toml"
STEPS = 40
GLOBAL_BATCH = 64
# Every rank pauses 6 s at step 11, so that the signal sent once step 10 is logged
# reaches running ranks (as in test_slurm_train.py).
PAUSE_AT_11 = {"HPCDP_FAULT": "stall:step=11:seconds=6"}
Cluster = Any  # tests/slurm/conftest.py's Cluster, reached through the fixture


def submit(cluster: Cluster, where: Path, data: Path, env: dict[str, str] | None = None) -> Any:
    """`hpcdp slurm submit --nodes 1-2` (one rank per node), the global batch fixed."""
    cmd = [sys.executable, "-m", "hpcdp", "slurm", "submit", "--site", "none",
           "--nodes", "1-2", "--cpus-per-task", "1", "--time", "10",
           "--signal-lead", "60", "--output", str(where / "job-%j.out"),
           "--save", str(where / "job.sbatch"), "--config", str(CONFIG),
           f"run.dir={where / 'run'}", f"data.path={data}", "run.epochs=1000",
           f"run.max_steps={STEPS}", f"data.global_batch_size={GLOBAL_BATCH}",
           "log.every_steps=5", "log.tensorboard=false", "log.progress=false",
           "checkpoint.every_steps=100000"]
    done = subprocess.run(cmd, env=cluster.job_env(env), cwd=where, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert "#SBATCH --nodes=1-2\n" in (where / "job.sbatch").read_text()
    return cluster.job(done.stdout.strip(), where)


def node_state(cluster: Cluster, node: str) -> str:
    done = cluster.run("scontrol", "show", "node", "-o", node)
    m = re.search(r"\bState=(\S+)", done.stdout)
    return m[1] if m else f"unknown ({done.stderr.strip()})"


def test_range_job_requeued_onto_fewer_nodes_resumes_exactly(
    slurm_cluster: Cluster, digits: tuple[Any, Path], tmp_path: Path,
) -> None:
    data = digits[1]
    (tmp_path / "ref").mkdir()
    ref = submit(slurm_cluster, tmp_path / "ref", data)
    ref.wait(timeout=240)
    ref_ranks = ref.rank_lines()
    assert {r["slurm_node"] for r in ref_ranks} == {"node1", "node2"}, ref.describe()
    assert all(r["size"] == 2 for r in ref_ranks), ref.describe()
    ref_summary = json.loads((tmp_path / "ref" / "run" / "summary.json").read_text())

    where = tmp_path / "requeued"
    where.mkdir()
    run = where / "run"
    job = submit(slurm_cluster, where, data, env=PAUSE_AT_11)
    try:
        job.wait_for_step(run, 10)
        assert job.info()["NodeList"] == "node[1-2]", job.describe()
        drained = slurm_cluster.run("scontrol", "update", "nodename=node2", "state=drain",
                                    "reason=test")
        assert drained.returncode == 0, drained.stderr
        signalled = slurm_cluster.run("scancel", "--signal=USR1", job.id)
        assert signalled.returncode == 0, signalled.stderr
        info = job.wait(timeout=300)
        assert info["Restarts"] == "1", job.describe()
        assert info["NodeList"] == "node1", job.describe()
    finally:
        slurm_cluster.run("scontrol", "update", "nodename=node2", "state=resume")
    assert "DRAIN" not in node_state(slurm_cluster, "node2")
    text = job.output()
    m = re.search(r"preempted at step (\d+): checkpoint written to (\S+), requeued job", text)
    assert m, f"no preemption checkpoint + requeue reported\n{job.describe()}"
    assert 10 <= int(m[1]) < STEPS
    second = [r for r in job.rank_lines() if r["slurm_node"] == "node1" and r["size"] == 1]
    assert len(second) == 1, f"the requeued run was not one rank on node1\n{job.describe()}"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["resumed_from"] == m[2].rstrip(",")
    assert summary["world_size"] == 1 and ref_summary["world_size"] == 2
    for key in ("steps", "samples_seen", "global_batch", "peak_lr"):
        assert summary[key] == ref_summary[key], (key, summary[key], ref_summary[key])
    assert summary["steps"] == STEPS and summary["samples_seen"] == STEPS * GLOBAL_BATCH
    assert job.leftover_processes() == []
