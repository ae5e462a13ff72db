"""The local cluster itself: two nodes, srun --mpi=pmix across them, parallel prep."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import h5py
import pytest

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
PREP_SBATCH = REPO / "slurm" / "prep.sbatch"
Cluster = Any  # tests/slurm/conftest.py's Cluster, reached through the fixture


def test_horovod_allreduce_across_two_nodes(slurm_cluster: Cluster, tmp_path: Path) -> None:
    worker = REPO / "tests" / "slurm" / "workers" / "hvd_allreduce.py"
    python = Path(sys.prefix) / "bin" / "python"  # the venv the tests run in
    job = slurm_cluster.sbatch(
        "--nodes=2", "--ntasks-per-node=1", f"--output={tmp_path}/smoke-%j.out",
        f"--wrap=srun --mpi=pmix --kill-on-bad-exit=1 {python} {worker}", cwd=tmp_path,
    )
    job.wait(timeout=90)
    lines = [json.loads(x.split("smoke ", 1)[1]) for x in job.output().splitlines()
             if x.startswith("smoke ")]
    assert sorted(r["rank"] for r in lines) == [0, 1], job.describe()
    assert {r["node"] for r in lines} == {"node1", "node2"}, job.describe()
    assert all(r["size"] == 2 and r["local_rank"] == 0 and r["sum"] == 3.0 for r in lines)


def test_prep_sbatch_writes_with_parallel_hdf5(digits: tuple[Any, Path]) -> None:
    job, out = digits
    assert "2 ranks" in job.output() and "datasets/digits.py" in job.output(), job.describe()
    with h5py.File(out / "train.h5", "r") as f, h5py.File(out / "val.h5", "r") as g:
        n_train, n_val = len(f["x"]), len(g["x"])
        assert len(f["y"]) == n_train
    assert n_train + n_val == 1797  # scikit-learn's digits, split once


def test_prep_sbatch_bad_arguments_fail_fast(slurm_cluster: Cluster, tmp_path: Path) -> None:
    job = slurm_cluster.sbatch("--ntasks=2", str(PREP_SBATCH), "nosuchsource", "--out",
                               str(tmp_path / "x"), cwd=tmp_path)
    job.wait(timeout=60, states=("FAILED",))
    assert "hpcdp prep nosuchsource" in job.output(), job.describe()  # the `hpcdp prep` form
    assert "invalid choice: 'nosuchsource'" in job.output(), job.describe()
    assert not (tmp_path / "x").exists()
    assert job.leftover_processes() == []
