"""A sweep chained after its data preparation, through `hpcdp slurm submit`, on the
local cluster; then `hpcdp slurm collect` over the tasks' results.

One submission covers the chain (prep, then the array with afterok on its id) and
the sweep (one task per override set, each in its own run folder and log).
"""

from __future__ import annotations

import csv
import io
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "hpcdp" / "configs" / "digits.toml"
Cluster = Any  # tests/slurm/conftest.py's Cluster, reached through the fixture


def hpcdp(cluster: Cluster, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hpcdp", *args], env=cluster.job_env(),
                          cwd=cwd, capture_output=True, text=True, timeout=120, check=False)


def test_sweep_after_prep_then_collect(slurm_cluster: Cluster, tmp_path: Path) -> None:
    sweep_dir = tmp_path / "sweep"
    done = hpcdp(slurm_cluster, tmp_path, "slurm", "submit",
                 "--prep", f"{REPO / 'datasets' / 'digits.py'} --out {tmp_path / 'data'}",
                 "--prep-ntasks", "2", "--grid", "optim.lr=0.05,0.2", "--throttle", "2",
                 "--sweep-dir", str(sweep_dir), "--ntasks-per-node", "2", "--time", "10",
                 "--signal-lead", "60", "--job-name", "lr-sweep", "--config", str(CONFIG),
                 f"data.path={tmp_path / 'data'}", "run.max_steps=4", "log.tensorboard=false",
                 "log.progress=false")
    assert done.returncode == 0, done.stderr
    array_id = done.stdout.strip()
    assert re.fullmatch(r"\d+", array_id), done.stdout
    prep_id = re.search(r"preparation job (\d+)", done.stderr)
    assert prep_id, done.stderr
    prep = slurm_cluster.job(prep_id[1], tmp_path)
    tasks = [slurm_cluster.job(f"{array_id}_{i}", tmp_path) for i in (0, 1)]
    prep.wait(timeout=120)
    for task in tasks:
        info = task.wait(timeout=180)
        assert info["ArrayTaskThrottle"] == "2"
        assert info["StartTime"] >= prep.info()["EndTime"], task.describe()  # afterok held
    for i in (0, 1):
        log = (sweep_dir / f"lr-sweep-{array_id}_{i}.out").read_text()
        assert f"outputs in {sweep_dir / f'task-{i}'}" in log, log

    plot = tmp_path / "lr.png"
    done = hpcdp(slurm_cluster, tmp_path, "slurm", "collect", str(sweep_dir), "--format", "csv",
                 "--plot", str(plot), "--metric", "val_acc")
    assert done.returncode == 0, done.stderr
    rows = list(csv.DictReader(io.StringIO(done.stdout)))
    assert [(r["task"], r["optim.lr"], r["state"], r["steps"]) for r in rows] == [
        ("0", "0.05", "done", "4"), ("1", "0.2", "done", "4")]
    # Each task trained with its own rate: the peak is lr x 64/32 (linear scaling, 2 ranks).
    assert [float(r["peak_lr"]) for r in rows] == [0.1, 0.4]
    assert plot.read_bytes()[:4] == b"\x89PNG"
