"""horovod.compression = "bf16": averaged in bf16 through an alltoall and an allgather
(Horovod has no bf16 all-reduce), the documented bits on every rank, under MPI and Gloo."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.parallel

WORKERS = Path(__file__).parent / "workers"
N_TRAIN, N_VAL = 480, 96
RUN_SETTINGS = ("log.every_steps=5", "checkpoint.every_steps=0", "run.epochs=1")
BOUND = 120.0


@pytest.mark.parametrize("launcher", ["mpirun", "horovodrun-gloo"])
def test_ranks_hold_the_documented_rounding(ranks, launcher: str) -> None:
    out = ranks([sys.executable, str(WORKERS / "bf16_buckets.py")], np=2, launcher=launcher,
                timeout=BOUND).output
    found = re.search(r"bf16-buckets ok (\d+)", out)  # mpirun may glue a tag to the digits
    assert found and int(found.group(1)) > 1, out  # several buckets


def test_training_with_bf16_keeps_the_ranks_identical(args, ranks, data: Path,
                                                      tmp_path: Path) -> None:
    run = tmp_path / "run"
    worker = [sys.executable, str(WORKERS / "train_same_params.py")]
    out = ranks(worker, *args(data, run, "horovod.compression=bf16", "horovod.bucket_mb=0.01"),
                np=2, timeout=BOUND).output
    steps = N_TRAIN // 32
    assert f"same-params step {steps}" in out
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == steps
    traffic = summary["gradient_traffic"]  # 2 bytes an element instead of float32's 4
    assert traffic["compression"] == "bf16"
    assert traffic["bytes_per_step"] * 2 == traffic["uncompressed_bytes_per_step"]
