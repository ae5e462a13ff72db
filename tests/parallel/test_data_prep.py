"""Parallel preparation on 2 real MPI ranks: one file, the same bytes as 1 rank, clean failures."""

from __future__ import annotations

import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from hpcdp.data.prep import cli as prep

pytestmark = pytest.mark.parallel

REPO = Path(__file__).resolve().parents[2]
PREP = [sys.executable, "-m", "hpcdp.data.prep.cli"]


def same_datasets(a: Path, b: Path) -> None:
    with h5py.File(a, "r") as fa, h5py.File(b, "r") as fb:
        assert set(fa) == set(fb)
        for name in fa:
            assert fa[name].chunks == fb[name].chunks
            np.testing.assert_array_equal(fa[name][...], fb[name][...])
        assert dict(fa.attrs) == dict(fb.attrs)


@pytest.mark.parametrize(("samples", "mpio"), [(5000, "independent"), (37, "collective")])
def test_two_ranks_write_the_same_file_as_one(ranks, tmp_path: Path, samples: int,
                                              mpio: str) -> None:
    """37 samples: rank 1 has fewer rows, and takes part in collective writes with none."""
    args = ["synthetic", "--samples", str(samples), "--shape", "3,16,16", "--seed", "3",
            "--val-samples", "100"]
    assert prep.main([*args, "--out", str(tmp_path / "one")]) == 0
    run = ranks(PREP, *args, "--mpio", mpio, "--out", str(tmp_path / "two"), np=2, timeout=120)
    assert "on 2 rank(s)" in run.output
    for split in ("train.h5", "val.h5"):
        same_datasets(tmp_path / "one" / split, tmp_path / "two" / split)
    assert sorted(p.name for p in (tmp_path / "two").iterdir()) == ["train.h5", "val.h5"]


def test_digits_recipe_and_arrays_on_two_ranks_then_read(ranks, tmp_path: Path) -> None:
    ranks([sys.executable, str(REPO / "datasets" / "digits.py")], "--out", str(tmp_path / "dg"),
          np=2, timeout=120)
    with h5py.File(tmp_path / "dg" / "train.h5") as f:
        assert f["x"].shape[1:] == (1, 8, 8) and f.attrs["source"] == "digits"
    n = 3000
    np.save(tmp_path / "x.npy", np.stack([np.arange(n), -np.arange(n)], 1).astype(np.float32))
    np.save(tmp_path / "y.npy", np.arange(n))
    ranks([sys.executable, str(REPO / "datasets" / "arrays.py")], "--x", str(tmp_path / "x.npy"),
          "--y", str(tmp_path / "y.npy"), "--out", str(tmp_path / "arr"), np=2, timeout=120)
    # The parallel-written file, read back on 2 ranks in the global order.
    labels = tmp_path / "labels.npy"
    ranks("data_reader", str(tmp_path / "arr" / "train.h5"), "--check-global-order",
          "--labels-out", str(labels), np=2, timeout=120)
    assert len(np.unique(np.load(labels))) == n // 48 * 48


def test_compressed_prep_on_two_ranks_is_written_by_rank_0(ranks, tmp_path: Path) -> None:
    ranks(PREP, "synthetic", "--samples", "400", "--shape", "64", "--compression", "gzip",
          "--out", str(tmp_path), np=2, timeout=120)
    with h5py.File(tmp_path / "train.h5") as f:
        assert f["x"].compression == "gzip" and f["x"].shape == (400, 64)


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (["arrays", "--x", "{d}/x.npy", "--y", "{d}/short.npy"], "x.npy has 50 samples but"),
        (["arrays", "--x", "{d}/missing.npy"], "missing.npy: no such file"),
        (["synthetic", "--samples", "0"], "--samples must be at least 1"),
    ],
)
def test_bad_input_on_two_ranks(ranks, tmp_path: Path, args: list[str], problem: str) -> None:
    np.save(tmp_path / "x.npy", np.zeros((50, 2)))
    np.save(tmp_path / "short.npy", np.zeros(49, np.int64))
    out = tmp_path / "out"
    out.mkdir()
    (out / "train.h5").write_bytes(b"previous good file")
    run = ranks(PREP, *[a.format(d=tmp_path) for a in args], "--out", str(out), np=2,
                timeout=90, expect_ok=False)
    assert not run.timed_out and run.returncode != 0, run.describe()
    for rank in (0, 1):
        assert f"[rank {rank}] hpcdp prep: error:" in run.output, run.describe()
    assert run.output.count(problem) >= 2, run.describe()
    assert (out / "train.h5").read_bytes() == b"previous good file"
    assert [p.name for p in out.iterdir()] == ["train.h5"]
