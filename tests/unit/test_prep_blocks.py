"""The block arithmetic every recipe shares: pure, and independent of the number of ranks."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcdp.data.prep import blocks as bl


@given(st.integers(0, 10_000), st.integers(1, 9))
@settings(max_examples=200, derandomize=True, deadline=None)
def test_byte_ranges_tile_the_input_in_rank_order(total: int, nranks: int) -> None:
    ranges = [bl.byte_range(total, r, nranks) for r in range(nranks)]
    assert ranges[0][0] == 0 and ranges[-1][1] == total
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    sizes = [hi - lo for lo, hi in ranges]
    assert max(sizes) - min(sizes) <= 1


@given(st.integers(0, 500), st.integers(1, 9))
@settings(max_examples=200, derandomize=True, deadline=None)
def test_rank_blocks_are_contiguous_and_in_rank_order(n: int, size: int) -> None:
    runs = [bl.rank_blocks(n, r, size) for r in range(size)]
    assert [i for run in runs for i in run] == list(range(n))


def test_plan_blocks_cuts_each_file_in_order_and_keeps_whole_files_whole() -> None:
    files = [("a.txt", 25), ("empty.txt", 0), ("b.gz", 30), ("c.txt", 10)]
    got = bl.plan_blocks(files, 10, whole=lambda p: p.endswith(".gz"))
    assert [(b.index, b.path, b.start, b.end) for b in got] == [
        (0, "a.txt", 0, 10), (1, "a.txt", 10, 20), (2, "a.txt", 20, 25),
        (3, "b.gz", 0, 30), (4, "c.txt", 0, 10)]
    with pytest.raises(ValueError, match="at least 1 byte"):
        bl.plan_blocks(files, 0)


def test_plan_items_covers_every_item_once() -> None:
    assert bl.plan_items(7, 3) == [range(0, 3), range(3, 6), range(6, 7)]
    assert bl.plan_items(0, 3) == []
    assert bl.items_per_block(3 * 64 * 64, 1 << 20) == 85
    assert bl.items_per_block(10 << 20, 1 << 20) == 1
    # whole units (chunks), and small inputs still cut into MIN_BLOCKS blocks for the ranks
    assert bl.items_per_block(100, 1 << 20, unit=64) == 64 * 163
    assert bl.items_per_block(100, 1 << 20, n_items=64 * 64 * 10, unit=64) == 640
    assert bl.items_per_block(100, 1 << 20, n_items=5, unit=64) == 64


@given(st.lists(st.sampled_from([b"a", b"bc", b"\n", b"\r\n", b"xyz"]), max_size=40),
       st.integers(1, 12))
@settings(max_examples=300, derandomize=True, deadline=None)
def test_every_line_is_in_exactly_one_block(pieces: list[bytes], block: int) -> None:
    data = b"".join(pieces)
    spans = [bl.line_span(data, b.start, b.end)
             for b in bl.plan_blocks([("f", len(data))], block)]
    assert b"".join(data[lo:hi] for lo, hi in spans) == data
    for lo, hi in (s for s in spans if s[0] < s[1]):  # whole lines, start to end
        assert lo == 0 or data[lo - 1 : lo] == b"\n"
        assert hi == len(data) or data[hi - 1 : hi] == b"\n"


def test_a_line_starting_exactly_at_a_block_boundary_belongs_to_that_block() -> None:
    data = b"0123\n5678\n"
    assert bl.line_span(data, 0, 5) == (0, 5)
    assert bl.line_span(data, 5, 10) == (5, 10)
    assert bl.line_span(data, 0, 6) == (0, 10)  # the line crossing 6 is read through
    assert bl.line_span(data, 6, 10) == (10, 10)  # no line begins in [6, 10)
