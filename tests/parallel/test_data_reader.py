"""The reader on several real MPI ranks: the global order, resume across world sizes, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest

from hpcdp.data.read import order as pt

pytestmark = pytest.mark.parallel

N, CHUNK = 2000, 16


def test_two_ranks_read_the_global_order(samples_file, ranks, tmp_path: Path) -> None:
    path = samples_file(tmp_path / "d.h5", N)
    out = tmp_path / "labels.npy"
    ranks("data_reader", str(path), "--seed", "4", "--epoch", "2", "--window", "50",
          "--check-global-order", "--labels-out", str(out), np=2, timeout=120)
    got = np.load(out)
    np.testing.assert_array_equal(got, pt.global_order(N, CHUNK, 4, 2, 48, 24, 50))
    assert len(np.unique(got)) == got.size == N // 48 * 48


def test_checkpoint_on_4_ranks_resume_on_2(samples_file, ranks, tmp_path: Path) -> None:
    path = samples_file(tmp_path / "d.h5", N)
    state, first, rest = tmp_path / "state.json", tmp_path / "first.npy", tmp_path / "rest.npy"
    ranks("data_reader", str(path), "--seed", "1", "--epoch", "3", "--steps", "7",
          "--state-out", str(state), "--labels-out", str(first), np=4, timeout=150)
    saved = json.loads(state.read_text())
    assert saved["position"] == 7 * 2 and saved["epoch"] == 3 and saved["virtual_shards"] == 24
    # Resume with 2 ranks and a larger global batch (72 = 2 x 36): no repeat, no skip.
    ranks("data_reader", str(path), "--global-batch", "72", "--epoch", "3", "--state-in",
          str(state), "--labels-out", str(rest), np=2, timeout=120)
    a, b = np.load(first), np.load(rest)
    ref = pt.global_order(N, CHUNK, 1, 3, 48, 24, saved["window"])
    np.testing.assert_array_equal(a, ref[:7])
    np.testing.assert_array_equal(
        b, pt.global_order(N, CHUNK, 1, 3, 72, 24, saved["window"], position=14,
                           stream_len=saved["stream_length"]))
    seen = np.concatenate([a.ravel(), b.ravel()])
    assert len(np.unique(seen)) == len(seen)
    assert N // 48 * 48 - len(seen) < 72


@pytest.mark.parametrize(
    ("kind", "problem"),
    [("missing", "no such file"), ("few", "fewer than one global batch"),
     ("mismatch", "'x' has 2000 samples but 'y' has 1999"), ("not_hdf5", "not an HDF5 file")],
)
def test_bad_input_every_rank_reports_and_exits(samples_file, ranks, tmp_path: Path, kind: str,
                                                problem: str) -> None:
    path = tmp_path / f"{kind}.h5"
    if kind == "few":
        samples_file(path, 40)
    elif kind == "mismatch":
        with h5py.File(path, "w") as f:
            f.create_dataset("x", data=np.zeros((2000, 2), np.float32))
            f.create_dataset("y", data=np.zeros(1999, np.int64))
    elif kind == "not_hdf5":
        path.write_bytes(b"\x00garbage" * 1000)
    run = ranks("data_reader", str(path), np=2, timeout=90, expect_ok=False)
    assert not run.timed_out and run.returncode != 0, run.describe()
    for rank in (0, 1):
        assert f"[rank {rank}] error: {path}: " in run.output, run.describe()
    assert run.output.count(problem) >= 2, run.describe()
