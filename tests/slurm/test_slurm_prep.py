"""slurm/prep.sbatch near its time limit: the batch shell requeues the job, and the requeued
run resumes from the blocks the stopped one completed, writing what one run writes."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

from hpcdp.data.prep import cli as prep

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
PREP_SBATCH = REPO / "slurm" / "prep.sbatch"
Cluster = Any  # tests/slurm/conftest.py's Cluster, reached through the fixture
#: Small chunks and blocks: about 700 parts, so that the job is stopped mid-way.
ARGS = ["synthetic", "--samples", "8000", "--shape", "3,16,16", "--val-samples", "500",
        "--chunk-mib", "0.002", "--block-mib", "0.01"]


def _parts(out: Path) -> int:
    folder = out / ".hpcdp-prep" / "train"
    return sum(1 for p in folder.iterdir() if not p.name.startswith(".")) if folder.is_dir() else 0


def test_prep_requeues_itself_before_its_time_limit_and_resumes(slurm_cluster: Cluster,
                                                                tmp_path: Path) -> None:
    out, whole = tmp_path / "out", tmp_path / "whole"
    job = slurm_cluster.sbatch("--ntasks=2", str(PREP_SBATCH), *ARGS, "--out", str(out),
                               cwd=tmp_path)
    job.wait_for("a first part", lambda: _parts(out) >= 1, timeout=120)
    # What --signal=B:USR1@120 sends before the time limit: USR1 to the batch shell alone.
    sent = slurm_cluster.run("scancel", "--batch", "--signal=USR1", job.id)
    assert sent.returncode == 0, sent.stderr
    # Meanwhile one uninterrupted run (in big blocks: the block size changes no output).
    assert prep.main([*ARGS, "--block-mib", "64", "--out", str(whole)]) == 0
    job.wait(timeout=240)
    log = job.output()
    assert "requeueing job" in log and "(restart 1)" in log, job.describe()
    assert "--resume" in log and "train: resuming: " in log, job.describe()
    assert "train: resuming: 0 of" not in log, job.describe()  # continued, not started again
    assert sorted(p.name for p in out.iterdir()) == ["train.h5", "val.h5"]
    for name in ("train.h5", "val.h5"):
        with h5py.File(whole / name) as a, h5py.File(out / name) as b:
            for key in a:
                np.testing.assert_array_equal(a[key][()], b[key][()], err_msg=key)
            assert {k: str(v) for k, v in a.attrs.items()} == {
                k: str(v) for k, v in b.attrs.items()}
    assert job.leftover_processes() == [], sys.stderr
