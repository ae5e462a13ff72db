"""The vocabulary on owner ranks: the range partition, the capped counts, and the ids of one
owner equal to `criteo.Vocabulary`'s (several owners: tests/parallel/test_criteo_prep.py)."""

from __future__ import annotations

import numpy as np
import pytest

from hpcdp.data.prep.clicks import criteo as cr
from hpcdp.data.prep.clicks import criteo_vocab as cv
from hpcdp.data.prep.world import SerialComm


@pytest.mark.parametrize("size", [1, 2, 3, 8])
def test_owners_are_increasing_ranges_of_the_values(size: int) -> None:
    values = np.sort(np.random.default_rng(size).integers(0, 2**32, 10_000))
    values[[0, -1]] = 0, 2**32 - 1
    own = cv.owners(values, size)
    assert own[0] == 0 and own[-1] == size - 1 and (np.diff(own) >= 0).all()
    assert np.bincount(own, minlength=size).min() > 10_000 / size * 0.8  # hashes spread
    at = cv.cuts(values, size)
    assert at[0] == 0 and at[-1] == len(values)
    for r in range(size):
        assert (own[at[r] : at[r + 1]] == r).all()


def test_owned_counts_merge_pieces_and_stop_at_the_cap(monkeypatch) -> None:
    monkeypatch.setattr(cv, "MERGE_AT", 50)  # merge often
    rng = np.random.default_rng(0)
    values = rng.zipf(1.3, (5000, 2)) % 700
    owned = cv.OwnedCounts(cap=4, fields=2)
    for piece in np.array_split(values, 37):
        block = cv.BlockValues.encode(piece.T.copy())
        for j in range(block.fields):
            owned.add(j, *block.field(j))
    for j in range(2):
        want_vals, want_nums = np.unique(values[:, j], return_counts=True)
        vals, nums = owned.counts(j)
        assert vals.tolist() == want_vals.tolist()
        assert nums.tolist() == np.minimum(want_nums, 4).tolist() and nums.dtype == np.uint8
    assert owned.kept()[1].tolist() == want_vals[want_nums >= 4].tolist()


def test_one_owner_gives_the_ids_of_the_whole_vocabulary() -> None:
    rng = np.random.default_rng(1)
    values = (rng.zipf(1.4, (3000, 3)) * 2654435761 % 2**32).astype(np.int64)
    values[rng.random(values.shape) < 0.1] = cr.EMPTY
    values[:5, 2] = 2**32 - 1  # the largest value there is
    comm = SerialComm()
    owned = cv.OwnedCounts(cap=3, fields=3)
    for block in np.array_split(values, 7):
        cv.send_counts(comm, cv.BlockValues.encode(block.T.copy()), owned)
    shard = cv.make_shard(comm, owned)
    whole = cr.Vocabulary.from_counts(cr.value_counts(values), 3)
    assert list(shard.table_sizes) == whole.table_sizes()
    new = np.concatenate([values[::7], [[5, cr.EMPTY, 2**32 - 2]]])
    assert (cv.ask_ids(comm, cv.BlockValues.encode(new.T.copy()), shard) == whole.ids(new)).all()
    again = cv.Shard.from_arrays(shard.arrays())
    assert (cv.ask_ids(comm, cv.BlockValues.encode(new.T.copy()), again) == whole.ids(new)).all()
    assert cv.ask_ids(comm, None, shard) is None
