"""The rounds of reading a split: every block parsed once whatever the ranks, inflating ranks
kept inflating while the queue is short, and a bad block stopping what follows it only."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcdp.data.prep.clicks import criteo_schedule as cs


def run(size: int, plain: dict[int, int], gzip: dict[int, int], per_round: int = 1
        ) -> tuple[list[int], list[dict[int, tuple[str, int]]]]:
    """Simulated rounds: plain files (position -> blocks) known at the start, gzip files
    (position -> blocks) inflated `per_round` blocks a round; the keys parsed, and the plans."""
    blocks = [cs.key(p, k) for p, n in plain.items() for k in range(n)]
    schedule = cs.Schedule.start(size, blocks, sorted(gzip))
    made = dict.fromkeys(gzip, 0)
    parsed, plans = [], []
    while not schedule.finished():
        plan = schedule.plan()
        plans.append(plan)
        assert len(plans) < 10_000
        for job, arg in plan.values():
            if job == cs.PARSE:
                parsed.append(arg)
                continue
            new = range(made[arg], min(gzip[arg], made[arg] + per_round))
            schedule.add(cs.key(arg, k) for k in new)
            made[arg] = new.stop
            if made[arg] == gzip[arg]:
                schedule.done_inflating(arg)
    return parsed, plans


@settings(max_examples=200, deadline=None)
@given(size=st.integers(1, 9), files=st.lists(st.tuples(st.booleans(), st.integers(0, 12)),
                                               max_size=6), per_round=st.integers(1, 3))
def test_every_block_is_parsed_once(size: int, files: list[tuple[bool, int]],
                                    per_round: int) -> None:
    plain = {p: n for p, (gz, n) in enumerate(files) if not gz}
    gzip = {p: n for p, (gz, n) in enumerate(files) if gz}
    parsed, plans = run(size, plain, gzip, per_round)
    want = [cs.key(p, k) for p, (_, n) in enumerate(files) for k in range(n)]
    assert sorted(parsed) == want and len(set(parsed)) == len(parsed)
    for plan in plans:  # one job a rank, a gzip file inflated by its own rank only
        for rank, (job, arg) in plan.items():
            assert 0 <= rank < size
            if job == cs.INFLATE:
                assert rank == cs.inflater(sorted(gzip).index(arg), size)


def test_one_gzip_file_keeps_one_rank_inflating_and_the_rest_parsing() -> None:
    _, plans = run(4, {}, {0: 40}, per_round=3)
    busy = [p for p in plans[2:-3]]  # after the start, before the queue drains
    assert all(len(plan) == 4 for plan in busy)  # nobody idle
    assert sum(plan[0][0] == cs.INFLATE for plan in busy) >= len(busy) // 2
    assert all(plan[r][0] == cs.PARSE for plan in busy for r in (1, 2, 3))


def test_inflaters_parse_only_when_the_queue_outlasts_this_round_and_the_next() -> None:
    schedule = cs.Schedule.start(2, [cs.key(1, k) for k in range(2)], [0])
    assert schedule.plan()[0] == (cs.INFLATE, 0)  # 2 queued: rank 1 takes one, 1 left
    schedule = cs.Schedule.start(2, [cs.key(1, k) for k in range(3)], [0])
    assert schedule.plan() == {0: (cs.PARSE, cs.key(1, 0)), 1: (cs.PARSE, cs.key(1, 1))}


def test_a_rank_inflates_its_files_one_after_another() -> None:
    schedule = cs.Schedule.start(2, [], [0, 1, 2])  # files 0 and 2 are rank 0's
    assert schedule.plan() == {0: (cs.INFLATE, 0), 1: (cs.INFLATE, 1)}
    schedule.done_inflating(0)
    assert schedule.plan() == {0: (cs.INFLATE, 2), 1: (cs.INFLATE, 1)}


def test_a_bad_block_stops_what_follows_it_but_not_what_comes_before() -> None:
    schedule = cs.Schedule.start(1, [cs.key(0, 0), cs.key(2, 0), cs.key(2, 1)], [1, 3])
    schedule.stop_after(cs.key(2, 0))
    assert list(schedule.queue) == [cs.key(0, 0)]  # the bad block was parsed already
    assert schedule.inflating == {1: 0}  # file 1 may still hold an earlier bad line


def test_keys_order_files_then_blocks() -> None:
    assert cs.key(0, cs.STRIDE - 1) < cs.key(1, 0)
    assert cs.position(cs.key(7, 123)) == 7
    with pytest.raises(ValueError, match="at most"):
        cs.key(0, cs.STRIDE)
