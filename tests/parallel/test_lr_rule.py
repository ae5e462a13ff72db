"""The learning rate follows the global batch: the digits config on 1 and on 4 ranks."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hpcdp.runtime.launcher import run_ranks

pytestmark = pytest.mark.parallel

REPO = Path(__file__).resolve().parents[2]
TRAIN = [sys.executable, "-m", "hpcdp.train", "--config", str(REPO / "hpcdp/configs/digits.toml")]


@pytest.fixture(scope="module")
def digits(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("lr") / "digits"
    subprocess.run([sys.executable, str(REPO / "datasets/digits.py"), "--out", str(out)],
                   check=True, timeout=120, capture_output=True)
    return out


# The rate is the rule's on both world sizes; 4 ranks also train to the accuracy (8 epochs,
# the module's cost). One rank stops after a few steps: with the same global batch it takes
# the steps 4 ranks take (test_train.py checks 1 rank against 2 with the same global batch).
@pytest.mark.parametrize(("np", "until"), [(1, "run.max_steps=4"), (4, "run.epochs=8")])
def test_same_global_batch_same_peak_rate_and_accuracy(digits: Path, tmp_path: Path,
                                                       np: int, until: str) -> None:
    run_dir = tmp_path / f"np{np}"
    run = run_ranks([*TRAIN, f"data.path={digits}", f"run.dir={run_dir}",
                     "data.global_batch_size=64", "run.epochs=8", until, "log.tensorboard=false",
                     "log.every_steps=1000", "checkpoint.every_steps=0"],
                    np=np, timeout=300.0)
    assert run.ok, run.describe()
    # The digits config states lr 0.05 for 32 samples: 64 global gives 0.1 on any world size.
    assert re.search(r"64 global, peak lr 0\.1 \(linear: 0\.05 x 64/32\)", run.output), run.output
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["world_size"] == np
    assert summary["global_batch"] == 64 and summary["lr_scaling"] == "linear"
    assert summary["peak_lr"] == pytest.approx(0.1)
    if np > 1:
        assert summary["val_acc"] >= 0.95, summary
    else:
        assert summary["steps"] == 4


def test_resume_that_would_change_the_peak_rate_is_refused(make_data, tmp_path: Path) -> None:
    data, run_dir = make_data(480, 96), tmp_path / "run"
    base = [sys.executable, "-m", "hpcdp.train", f"data.path={data}", f"run.dir={run_dir}",
            "data.val_batch_size=16", "optim.lr=0.05", "log.tensorboard=false", "run.epochs=2"]
    first = run_ranks([*base, "data.global_batch_size=32", "run.stop_at_step=3"], np=2,
                      timeout=120.0)
    assert first.ok, first.describe()
    batch_change = "a global batch of 32 samples per step, but this run takes 64"
    for change, needle in (("data.global_batch_size=64", batch_change),
                           ("optim.lr=0.1", "peak lr 0.05 -> 0.1")):
        refused = run_ranks([*base, "data.global_batch_size=32", change], np=2, timeout=120.0)
        assert refused.returncode != 0 and not refused.timed_out, refused.describe()
        assert needle in refused.output and "optim.allow_lr_change=true" in refused.output, \
            refused.describe()
    allowed = run_ranks([*base, "data.global_batch_size=32", "optim.lr=0.1",
                         "optim.allow_lr_change=true"], np=2, timeout=120.0)
    assert allowed.ok and "resumed from" in allowed.output, allowed.describe()
    assert "peak lr 0.1 " in allowed.output
