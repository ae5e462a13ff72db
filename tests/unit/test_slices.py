"""Evaluation reads every sample exactly once on any number of ranks (data.read.evaluation)."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from hpcdp.data.read.evaluation import SliceReader, rank_rows


@given(st.integers(0, 5000), st.integers(1, 64))
def test_rank_rows_cover_every_sample_once(n: int, world: int) -> None:
    rows = [rank_rows(n, r, world) for r in range(world)]
    assert rows[0][0] == 0 and rows[-1][1] == n
    assert all(a[1] == b[0] for a, b in zip(rows, rows[1:], strict=False))
    sizes = [hi - lo for lo, hi in rows]
    assert max(sizes) - min(sizes) <= 1


def test_ranks_read_the_whole_file_in_short_last_batches(tmp_path: Path) -> None:
    path = tmp_path / "v.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=np.arange(99 * 2, dtype=np.uint8).reshape(99, 2))
        f.create_dataset("y", data=np.arange(99))
    seen, batches = [], []
    for rank in range(2):
        r = SliceReader(path, ["x", "y"], batch_size=7, rank=rank, world_size=2)
        got = list(r)
        batches.append(len(got))
        assert len(got) == len(r)
        for x, y in got:
            np.testing.assert_array_equal(x[:, 0].numpy(), (y.numpy() * 2) % 256)
            seen += y.tolist()
    assert sorted(seen) == list(range(99)) and batches == [7, 8]  # 49 and 50 samples


def test_one_dataset_gives_batches_shaped_like_the_training_reader(tmp_path: Path) -> None:
    path = tmp_path / "t.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("tokens", data=np.arange(10 * 4).reshape(10, 4))
    (first, none), *_ = SliceReader(path, ["tokens"], batch_size=4)
    assert none is None and first.shape == (4, 4)
