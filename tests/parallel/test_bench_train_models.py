"""`hpcdp bench train` end to end for the click model's two gradient modes and the GPT-2 shape.

Tiny settings (the small tables only, a few steps; the GPT-2 shape narrowed by
--set to one thin layer, its vocabulary and 1,024-token windows kept): this
checks the plumbing and the shape of the results, not which mode wins.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from hpcdp.bench import main as bench_main
from hpcdp.data.prep.clicks import synth as clicks

pytestmark = pytest.mark.parallel


def _positive(value: object) -> bool:
    return isinstance(value, float) and math.isfinite(value) and value > 0


@pytest.mark.extended  # a benchmark's whole run: CI's second tier
def test_bench_train_dlrm_both_modes(tmp_path: Path, capsys) -> None:
    argv = ["train", "--models", "dlrm", "--tables", "small", "--batch", "64", "--steps", "2",
            "--warmup", "2", "--window", "2", "--rounds", "1", "--no-plot", "--timeout", "120",
            "--out", str(tmp_path)]
    assert bench_main(argv) == 0
    printed = capsys.readouterr().out
    assert "sent MiB/step" in printed and "wins by" in printed
    result = json.loads((tmp_path / "train.json").read_text())
    assert sorted((r["model"], r["np"]) for r in result["runs"]) == [
        ("dlrm_small_dense", 1), ("dlrm_small_dense", 2),
        ("dlrm_small_sparse", 1), ("dlrm_small_sparse", 2)]
    assert result["ddp"] == [] and result["bare"] == []
    small = result["recsys"]["small"]
    assert small["winner"] in ("sparse", "dense") and small["speedup"] >= 1.0
    sparse, dense = small["modes"]["sparse"], small["modes"]["dense"]
    for mode in (sparse, dense):
        for key in ("samples_per_s_1", "samples_per_s_2", "efficiency", "table_mib",
                    "sent_mib"):
            assert _positive(mode[key]), (key, mode)
    # Dense hands over every table whole (1,105 rows x 16 floats), whatever the batch.
    rows = sum(clicks.table_sizes(clicks.ClickSpec(users=100, items=50, min_table=10,
                                                   max_table=100)))
    assert dense["table_mib"] == pytest.approx(rows * 16 * 4 / 2**20)
    # Sparse: the distinct rows of a batch of 64 (with their indices), fewer than all.
    assert sparse["table_mib"] < rows * (16 * 4 + 8) / 2**20
    assert dense["sent_mib"] > dense["table_mib"]  # plus the MLPs' all-reduce


@pytest.mark.extended  # a benchmark's whole run: CI's second tier
def test_bench_train_gpt2_shape_data_share(tmp_path: Path, capsys) -> None:
    argv = ["train", "--models", "gpt2_124m", "--steps", "2", "--warmup", "1", "--window", "1",
            "--rounds", "1", "--no-ddp", "--no-plot", "--timeout", "120",
            "--set", "lm.layers=1", "--set", "lm.heads=1", "--set", "lm.width=16",
            "--out", str(tmp_path)]
    assert bench_main(argv) == 0
    printed = capsys.readouterr().out
    assert "gpt2_124m: tokens/s 1 rank" in printed and "data share of the step" in printed
    result = json.loads((tmp_path / "train.json").read_text())
    s = result["summary"]["gpt2_124m"]
    # The trainer's own tokens per window: the runs read windows of 1,024 tokens.
    assert [r["tokens_per_window"] for r in result["runs"]] == pytest.approx([1024, 1024])
    assert s["seq_len"] == 1024
    assert s["tokens_per_s_1"] == pytest.approx(1024 * s["samples_per_s_1"])
    assert s["tokens_per_s_2"] == pytest.approx(1024 * s["samples_per_s_2"])
    assert 0.0 < s["data_share_1"] < 1.0 and 0.0 < s["shares"]["data"] < 1.0
    assert set(result["summary"]["checks"]) == {"gpt2_124m data share < 2% (1 and 2 ranks)"}
