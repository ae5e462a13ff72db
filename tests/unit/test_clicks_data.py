"""The click log generator: deterministic rows, ids in their tables, the planted signal."""

from __future__ import annotations

from dataclasses import fields

import numpy as np
import pytest

from hpcdp.data.prep.clicks import synth as ck

SMALL = ck.ClickSpec(rows=30_000, val_rows=20_000, seed=3, users=300, items=200, max_table=5000)


@pytest.fixture(scope="module")
def world() -> ck.ClickWorld:
    return ck.ClickWorld(SMALL).calibrate()


def _equal(a: ck.Rows, b: ck.Rows) -> None:
    for f in ("dense", "sparse", "label", "prob", "popularity"):
        np.testing.assert_array_equal(getattr(a, f), getattr(b, f), err_msg=f)


def test_rows_do_not_depend_on_how_the_file_is_cut(world: ck.ClickWorld) -> None:
    whole = world.rows("train", 1000, 21000)
    cuts = [1000, 1001, 8192, 9000, 16384, 21000]
    parts = [world.rows("train", a, b) for a, b in zip(cuts[:-1], cuts[1:])]
    joined = ck.Rows(*(np.concatenate([getattr(p, f.name) for p in parts])
                       for f in fields(ck.Rows)))
    _equal(whole, joined)
    # A fresh world from the same spec (another rank, another run) gives the same rows.
    _equal(whole, ck.ClickWorld(SMALL).calibrate().rows("train", 1000, 21000))


def test_seed_and_split_change_the_rows(world: ck.ClickWorld) -> None:
    other = ck.ClickWorld(ck.ClickSpec(**{**SMALL.params(), "seed": 4})).calibrate()
    head = world.rows("train", 0, 500)
    assert not np.array_equal(head.sparse, other.rows("train", 0, 500).sparse)
    assert not np.array_equal(world.rows("train", 0, 500).dense, world.rows("val", 0, 500).dense)


def test_shapes_dtypes_and_ids_inside_their_tables(world: ck.ClickWorld) -> None:
    r = world.rows("train", 0, SMALL.rows)
    assert r.dense.shape == (SMALL.rows, 13) and r.dense.dtype == np.float32
    assert r.sparse.shape == (SMALL.rows, 26) and r.sparse.dtype == np.int32
    assert r.label.dtype == np.uint8 and set(np.unique(r.label)) == {0, 1}
    assert (r.sparse >= 0).all() and (r.sparse < np.array(world.sizes)).all()
    assert len(ck.field_names()) == len(world.sizes) == 26


def test_table_sizes_span_small_to_large() -> None:
    sizes = ck.table_sizes(ck.ClickSpec(max_table=10**6))
    assert sizes[:2] == [1000, 500]
    assert min(sizes[2:]) == 10 and max(sizes[2:]) == 10**6
    assert ck.side_table_sizes(3, 10, 1000) == [10, 100, 1000]


def test_click_rate_near_the_target(world: ck.ClickWorld) -> None:
    r = world.rows("val", 0, SMALL.val_rows)
    assert abs(r.prob.mean() - 0.25) < 0.01
    assert abs(r.label.mean() - 0.25) < 0.015


def test_popularity_is_zipf_and_side_fields_follow_their_owner(world: ck.ClickWorld) -> None:
    r = world.rows("train", 0, SMALL.rows)
    counts = np.bincount(r.sparse[:, 1], minlength=SMALL.items)
    assert counts[0] > counts[5] > counts[50] > 0
    assert counts[0] > 0.05 * SMALL.rows  # the most popular item takes a large share
    # user_side_0 is a function of the user: one value per user.
    users, side = r.sparse[:, 0], r.sparse[:, 2]
    for u in np.unique(users)[:20]:
        assert len(np.unique(side[users == u])) == 1


def test_the_oracle_beats_popularity_which_beats_chance(world: ck.ClickWorld) -> None:
    r = world.rows("val", 0, SMALL.val_rows)
    aucs = ck.reference_aucs(r.label, r.prob, r.popularity)
    assert aucs["oracle_auc"] > aucs["baseline_auc"] + 0.1
    assert aucs["baseline_auc"] > 0.55


@pytest.mark.parametrize(("change", "word"), [
    ({"rows": 0}, "--rows"), ({"max_table": 5}, "--max-table"), ({"zipf": 0.0}, "--zipf"),
    ({"click_rate": 1.0}, "--click-rate"), ({"users": 2**31}, "int32"),
])
def test_bad_options_are_named(change: dict, word: str) -> None:
    with pytest.raises(ck.ClickSpecError, match=word):
        ck.ClickSpec(**{**SMALL.params(), **change}).check()
