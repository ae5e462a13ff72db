"""On 2 MPI ranks, preparation refuses to replace an existing dataset unless --overwrite."""

from __future__ import annotations

import sys
from pathlib import Path

import h5py
import pytest

from hpcdp.data.prep import cli as prep

pytestmark = pytest.mark.parallel

PREP = [sys.executable, "-m", "hpcdp.data.prep.cli"]


def test_existing_dataset_is_kept_on_every_rank_unless_overwrite(ranks, tmp_path: Path) -> None:
    out = tmp_path / "data"
    args = ["synthetic", "--samples", "300", "--shape", "4", "--out", str(out)]
    assert prep.main([*args, "--seed", "1"]) == 0
    old = (out / "train.h5").read_bytes()

    run = ranks(PREP, *args, "--seed", "2", np=2, timeout=90, expect_ok=False)
    assert not run.timed_out and run.returncode == 2, run.describe()
    assert "Traceback" not in run.output, run.describe()
    for rank in (0, 1):
        assert (f"[rank {rank}] hpcdp prep: error: {out / 'train.h5'} already exists; "
                "pass --overwrite") in run.output, run.describe()
    assert (out / "train.h5").read_bytes() == old
    assert [p.name for p in out.iterdir()] == ["train.h5"]

    ranks(PREP, *args, "--seed", "2", "--overwrite", np=2, timeout=90)
    assert [p.name for p in out.iterdir()] == ["train.h5"]  # renamed over, no temporary left
    with h5py.File(out / "train.h5") as f:
        assert f.attrs["seed"] == 2 and f["x"].shape == (300, 4)
