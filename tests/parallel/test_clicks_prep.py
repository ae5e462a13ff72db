"""The click recipe under mpirun: the same files on 1 and 2 ranks; no output replaced unasked."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from hpcdp.runtime.launcher import rank_environment

pytestmark = pytest.mark.parallel

SCRIPT = Path(__file__).resolve().parents[2] / "datasets" / "clicks.py"
ARGS = ["--rows", "20000", "--val-rows", "6000", "--users", "100", "--items", "80",
        "--max-table", "2000", "--seed", "7"]


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_one_and_two_ranks_write_the_same_files(ranks, tmp_path: Path) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    serial = subprocess.run([sys.executable, str(SCRIPT), "--out", str(one), *ARGS],
                            env=rank_environment(), capture_output=True, text=True, timeout=120)
    assert serial.returncode == 0, serial.stderr
    run = ranks([sys.executable, str(SCRIPT)], "--out", str(two), *ARGS, np=2, timeout=120)
    assert "oracle_auc" in run.output
    for split in ("train", "val"):
        with h5py.File(one / f"{split}.h5") as a, h5py.File(two / f"{split}.h5") as b:
            assert sorted(a) == sorted(b) == ["dense", "label", "sparse"]
            assert len({a[k].chunks[0] for k in a}) == 1  # one row chunking for all fields
            for key in a:
                np.testing.assert_array_equal(a[key][:], b[key][:], err_msg=f"{split} {key}")
                assert a[key].chunks == b[key].chunks
            assert sorted(a.attrs) == sorted(b.attrs)
            for key in a.attrs:
                np.testing.assert_array_equal(a.attrs[key], b.attrs[key], err_msg=key)
    with h5py.File(two / "val.h5") as f:
        assert f.attrs["oracle_auc"] > f.attrs["baseline_auc"] + 0.1 > 0.6
        assert abs(f.attrs["click_rate"] - 0.25) < 0.03
        assert list(f.attrs["table_sizes"][:2]) == [100, 80]


def test_an_existing_output_is_kept_unless_overwrite(ranks, tmp_path: Path) -> None:
    out = tmp_path / "data"
    small = ["--rows", "3000", "--val-rows", "1000", "--users", "20", "--items", "20",
             "--max-table", "100"]
    ranks([sys.executable, str(SCRIPT)], "--out", str(out), *small, np=2, timeout=120)
    before = {p.name: _digest(p) for p in out.glob("*.h5")}
    run = ranks([sys.executable, str(SCRIPT)], "--out", str(out), *small, "--seed", "9",
                np=2, timeout=120, expect_ok=False)
    assert not run.timed_out and run.returncode != 0, run.describe()
    for rank in (0, 1):
        assert (f"[rank {rank}] hpcdp prep clicks: error: {out}/train.h5 exists; pass "
                "--overwrite") in run.output
    assert {p.name: _digest(p) for p in out.glob("*.h5")} == before
    ranks([sys.executable, str(SCRIPT)], "--out", str(out), *small, "--seed", "9",
          "--overwrite", np=2, timeout=120)
    after = {p.name: _digest(p) for p in out.glob("*.h5")}
    assert after.keys() == before.keys() and after["train.h5"] != before["train.h5"]
    assert not list(out.glob(".*tmp*"))


def test_a_bad_click_file_is_named_on_every_rank(ranks, tmp_path: Path) -> None:
    out = tmp_path / "data"
    ranks([sys.executable, str(SCRIPT)], "--out", str(out), "--rows", "3000", "--val-rows", "0",
          "--users", "20", "--items", "20", "--max-table", "100", np=2, timeout=120)
    ranks("clicks_check", str(out / "train.h5"), np=2, timeout=60)
    with h5py.File(out / "train.h5", "r+") as f:
        f["sparse"][1234, 0] = 20  # the user table has 20 rows
    run = ranks("clicks_check", str(out / "train.h5"), np=2, timeout=60, expect_ok=False)
    assert not run.timed_out and run.returncode != 0, run.describe()
    for rank in (0, 1):
        assert (f"[rank {rank}] error: field 'user' (column 0 of 'sparse'): id 20 is outside "
                f"its table of 20 rows, in rows [0, 3000) of {out}/train.h5 (first at row 1234)"
                in run.output), run.describe()
