"""`hpcdp bench large-batch` end to end on the digits: real 2-rank runs at the reference
batch and at 8x, one compressed; checks the plumbing and the shape of the results
(that the reference learns, that PowerSGD's bytes are fewer), not which optimizer wins."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcdp.bench import main as bench_main

pytestmark = pytest.mark.parallel


@pytest.mark.extended  # a benchmark's whole run, six trainings: CI's second tier
def test_bench_large_batch_digits(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["large-batch", "--workloads", "digits", "--mults", "1,8", "--compressions",
            "none,powersgd:4", "--epochs", "2", "--timeout", "180", "--out", str(tmp_path)]
    assert bench_main(argv) == 0
    printed = capsys.readouterr().out
    assert "Large global batches" in printed and "digits (val acc, reference" in printed
    result = json.loads((tmp_path / "large-batch.json").read_text())
    runs = {r["case"]: r for r in result["results"]}
    assert sorted(runs) == sorted([
        "digits-x1-sgd-linear", "digits-x1-lars-linear", "digits-x8-sgd-linear",
        "digits-x8-sgd-sqrt", "digits-x8-lars-linear", "digits-x1-sgd-linear-powersgd4"])
    ref, big = runs["digits-x1-sgd-linear"], runs["digits-x8-sgd-linear"]
    assert ref["metric"] > 0.5  # 10 classes: it learned
    # The same epochs: 8x the batch, 8x fewer steps (each epoch's last partial batch dropped).
    assert big["steps"] == 2 * (1438 // 64) and ref["steps"] == 2 * (1438 // 8)
    assert ref["bytes_per_step"] == ref["uncompressed_bytes"]
    psgd = runs["digits-x1-sgd-linear-powersgd4"]
    assert psgd["uncompressed_bytes"] == ref["uncompressed_bytes"]
    assert 0 < psgd["bytes_per_step"] < ref["bytes_per_step"]
