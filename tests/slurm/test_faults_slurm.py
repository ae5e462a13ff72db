"""Faults under Slurm's srun: a rank SIGKILLed mid-step ends the whole job step quickly.

slurm/train.sbatch runs the ranks with `srun --kill-on-bad-exit=1`, so one task dying
makes Slurm kill the others instead of leaving them waiting in a collective. The
same sbatch command, submitted again without the fault, resumes from the last good
checkpoint and finishes. (Cancelled-job behaviour: tests/slurm/test_slurm_train.py.)
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest

from hpcdp.train import checkpoint_folder as ckfolder

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
TRAIN_SBATCH = REPO / "slurm" / "train.sbatch"
CONFIG = REPO / "hpcdp" / "configs" / "digits.toml"
STEPS = 12


def train_args(run_dir: Path, data: Path) -> list[str]:
    return ["--config", str(CONFIG), f"run.dir={run_dir}", f"data.path={data}",
            "run.epochs=1000", f"run.max_steps={STEPS}", "log.every_steps=2",
            "log.tensorboard=false", "log.progress=false", "checkpoint.every_steps=4"]


def test_sigkill_under_srun_ends_job_and_resubmit_resumes(
        slurm_cluster: Any, digits: tuple[Any, Path], tmp_path: Path) -> None:
    run = tmp_path / "run"
    start = time.monotonic()
    job = slurm_cluster.sbatch("--ntasks=2", str(TRAIN_SBATCH), *train_args(run, digits[1]),
                               cwd=tmp_path, env={"HPCDP_FAULT": "kill:rank=1:step=6"})
    job.wait_for("the SIGKILL", lambda: "kills itself (SIGKILL)" in job.output(), timeout=120)
    killed = time.monotonic()
    info = job.wait(timeout=60, states=("FAILED",))
    assert time.monotonic() - killed < 60, job.describe()
    assert info["Restarts"] == "0"
    out = job.output()
    assert "rank 1 kills itself (SIGKILL) at step 6" in out
    assert re.search(r"ranks finished with exit status [1-9]", out), job.describe()
    assert job.leftover_processes() == [], job.describe()
    assert [s for s, _ in ckfolder.list_checkpoints(run / "checkpoints")] == [4]

    again = slurm_cluster.sbatch("--ntasks=2", str(TRAIN_SBATCH), *train_args(run, digits[1]),
                                 cwd=tmp_path)
    again.wait(timeout=180)
    assert f"resumed from {run / 'checkpoints' / 'step-00000004.pt'}" in again.output()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == STEPS and summary["resumed_from"].endswith("step-00000004.pt")
    assert time.monotonic() - start < 400
