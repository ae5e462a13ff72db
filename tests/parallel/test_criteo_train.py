"""criteo.toml on 2 ranks: a synthetic Criteo-format log, prepared by the recipe, trains with
the table sizes read from the prepared file and reports val_auc and val_logloss."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import h5py
import pytest

from hpcdp.data.prep.clicks import criteo_recipe as criteo_prep
from hpcdp.data.synth import criteo_logs as cs

pytestmark = pytest.mark.parallel

REPO = Path(__file__).resolve().parents[2]
TRAIN = [sys.executable, "-m", "hpcdp.train"]


def test_criteo_config_trains_on_a_prepared_log(ranks, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    assert cs.main(["--out", str(logs), "--rows", "4000", "--val-rows", "1000",
                    "--users", "50", "--items", "30"]) == 0
    oracle = json.loads((logs / "oracle.json").read_text())["oracle_auc"]
    assert 0.6 < oracle < 1.0
    data = tmp_path / "data"
    assert criteo_prep.main(["--files", str(logs / "train_*"), "--val-files",
                             str(logs / "val.txt"), "--out", str(data), "--min-count", "2"]) == 0
    with h5py.File(data / "train.h5") as f:
        sizes = list(f.attrs["table_sizes"])
        assert f.attrs["num_samples"] == 4000 and sizes[:2] <= [52, 32]
    run = tmp_path / "run"
    ranks(TRAIN, "--config", str(REPO / "hpcdp" / "configs" / "criteo.toml"),
          f"data.path={data}", f"run.dir={run}", "run.max_steps=12", "data.batch_size=64",
          "log.every_steps=4", "log.tensorboard=false", np=2, timeout=180)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["val_samples"] == 1000
    assert 0.5 < summary["val_auc"] <= 1.0 and math.isfinite(summary["val_logloss"])
