"""The partition at its edges: the order pinned, every refusal in full, empty ranges.

Each test pins down a behaviour that mutation testing (`make mutate`) found
unguarded.
"""

from __future__ import annotations

import numpy as np
import pytest

from hpcdp.data.read import order as pt

# ---- the order of ORDER_VERSION 2 never changes -------------------------------------------
# A reader's resume state records ORDER_VERSION; a run resumed after an upgrade reads the
# rest of its epoch in this order. Any change to the order (the key's hashing, the
# generator's state, numpy's permutation) must come with a new ORDER_VERSION.


def test_order_version_2_is_pinned() -> None:
    assert pt.ORDER_VERSION == 2
    assert pt.epoch_block_order(100, 7, 3, 2).tolist() == [
        12, 13, 8, 10, 5, 0, 6, 11, 2, 4, 3, 9, 14, 7, 1]
    assert pt.window_permutation(3, 2, 1, 0, 12).tolist() == [
        5, 0, 7, 10, 11, 2, 3, 9, 1, 6, 4, 8]
    assert pt.window_permutation(0, 0, 0, 0, 12).tolist() == [
        0, 8, 9, 2, 1, 3, 7, 10, 4, 11, 5, 6]
    assert pt.global_order(40, 3, 5, 1, 8, 4, 6).tolist() == [
        [12, 3, 34, 15, 39, 2, 23, 22], [14, 13, 17, 16, 32, 30, 19, 21],
        [5, 4, 35, 6, 31, 24, 38, 18], [33, 27, 8, 1, 37, 26, 9, 20],
        [28, 29, 7, 0, 25, 36, 11, 10]]


def test_the_block_order_depends_on_the_seed() -> None:
    other_seed = pt.epoch_block_order(100, 7, 4, 2)
    assert other_seed.tolist() != pt.epoch_block_order(100, 7, 3, 2).tolist()


# ---- refusals in full ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: pt.epoch_block_order(-1, 4, 0, 0), "num_samples must be non-negative, got -1"),
        (lambda: pt.epoch_block_order(10, 4, -2, 0), "seed must be non-negative, got -2"),
        (lambda: pt.epoch_block_order(10, 4, 0, -3), "epoch must be non-negative, got -3"),
        (lambda: pt.num_blocks(10, 0), "block must be at least 1, got 0"),
        (lambda: pt.steps_per_epoch(10, 0), "global batch must be at least 1, got 0"),
        (lambda: pt.check_virtual_shards(0, 8), "virtual shards must be at least 1, got 0"),
        (lambda: pt.rank_streams(6, 4, 0), "6 virtual shards cannot be split evenly over 4 ranks"),
        (lambda: pt.positions_to_runs(10, 3, pt.epoch_block_order(10, 3, 0, 0), 4, 11),
         "positions [4, 11) outside 0..10"),
        (lambda: pt.stream_runs(10, 3, pt.epoch_block_order(10, 3, 0, 0), 5, 0, 3, 6),
         "stream positions [3, 6) outside 0..5"),
        (lambda: pt.window_bounds(10, 0, 0), "window must be at least 1 sample, got 0"),
        (lambda: pt.rank_order(40, 3, 0, 0, 8, 4, 6, rank=0, world_size=0),
         "4 virtual shards cannot be split evenly over 0 ranks"),
    ],
)
def test_refusals_in_full(call, message: str) -> None:
    with pytest.raises(pt.PartitionError) as err:
        call()
    assert str(err.value) == message


# ---- empty ranges --------------------------------------------------------------------------


def test_empty_ranges_give_empty_integer_indices() -> None:
    order = pt.epoch_block_order(10, 3, 0, 0)
    assert pt.stream_runs(10, 3, order, 5, 1, 2, 2) == []
    for idx in (pt.runs_to_indices([]), pt.stream_order(10, 3, 0, 0, 0, 0, 4)):
        assert idx.shape == (0,) and idx.dtype.kind == "i"
        assert np.arange(5)[idx].size == 0  # usable as indices


def test_runs_span_many_blocks_in_one_call() -> None:
    order = pt.epoch_block_order(20, 3, 0, 0)
    runs = pt.positions_to_runs(20, 3, order, 0, 20)
    assert sorted(pt.runs_to_indices(runs).tolist()) == list(range(20))
    assert pt.runs_to_indices(runs).tolist() == [
        r for b in order for r in range(3 * int(b), min(20, 3 * int(b) + 3))]
