"""`hpcdp plan --config`: the real 1-rank measurements (at a batch and at half of it) under
mpirun, the gradient layout the trainer records, and the table."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hpcdp.models.vision import build_model
from hpcdp.train.numerics import count_parameters

pytestmark = pytest.mark.parallel

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "hpcdp" / "configs" / "digits.toml"


def test_plan_measures_one_rank_and_predicts(make_data, tmp_path: Path) -> None:
    data = make_data(480, 96)
    two_alpha, beta = 2e-5, 1e-9  # a network: 2 alpha + n beta on 2 ranks
    (tmp_path / "ar.json").write_text(json.dumps({"np": 2, "rows": [
        {"config": "mpi-hpcdp", "column": "hvd_", "bytes": n,
         "seconds_median": two_alpha + n * beta} for n in (4096, 1 << 20, 16 << 20)]}))
    out = tmp_path / "plan.json"
    cmd = [sys.executable, "-m", "hpcdp", "plan", "--config", str(CONFIG), f"data.path={data}",
           "image.num_classes=4", "--global-batch", "32", "--ranks-per-node", "2",
           "--steps", "10", "--warmup", "5", "--max-nodes", "3", "--timeout", "150",
           "--allreduce", str(tmp_path / "ar.json"), "--json", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=400, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 rank, batch 16 and 8" in done.stdout  # one node's per-rank batch, and half
    plan = json.loads(out.read_text())
    # The trainer's record of the gradients: every parameter of the digits CNN, in float32.
    net = build_model("digits_cnn", (1, 8, 8), 4)
    assert sum(plan["measured"]["bucket_bytes"]) == 4 * count_parameters(net)
    assert plan["measured"]["batch"] == 16
    preds = plan["predictions"]
    assert [(p["nodes"], p["ranks"]) for p in preds] == [(1, 2), (2, 4), (3, 6)]
    assert all(p["step_s"] > 0 and p["samples_per_s"] > 0 for p in preds)
    assert [p["fits_batch"] for p in preds] == [True, True, False]
