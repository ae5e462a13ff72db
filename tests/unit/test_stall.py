"""The stall rules (pure): the bound, heartbeat records, who is behind, the report."""

from __future__ import annotations

import pytest

from hpcdp import config as cfgmod
from hpcdp.config import ConfigError, HorovodConfig, horovod_stall_error
from hpcdp.runtime.stall import (
    CHECKPOINT,
    RECORD_BYTES,
    START,
    STEP,
    VALIDATION,
    Beat,
    StallRule,
    bound_s,
    format_beat,
    laggards,
    parse_beat,
    rank_list,
    report,
    reporters,
)

AUTO = StallRule(timeout_s=-1, floor_s=300, multiple=10, warmup_factor=3)


def test_auto_bound_is_the_floor_or_a_multiple_of_the_slowest_seen() -> None:
    seen = {STEP: 0.5, VALIDATION: 90.0, CHECKPOINT: 20.0}
    assert bound_s(AUTO, STEP, seen) == 300  # 10 x 0.5 s is below the floor
    assert bound_s(AUTO, VALIDATION, seen) == 900  # 10 x 90 s
    assert bound_s(AUTO, CHECKPOINT, seen) == 300
    assert bound_s(AUTO, STEP, {STEP: 45.0}) == 450


def test_auto_bound_gives_the_first_of_each_kind_warm_up_room() -> None:
    assert bound_s(AUTO, START, {START: 1.0}) == 900  # the start is never "measured"
    assert bound_s(AUTO, STEP, {}) == 900
    assert bound_s(AUTO, VALIDATION, {STEP: 0.1}) == 900
    assert bound_s(AUTO, CHECKPOINT, {STEP: 0.1, VALIDATION: 1.0}) == 900


def test_fixed_and_off() -> None:
    fixed = StallRule(timeout_s=20, floor_s=300, multiple=10, warmup_factor=3)
    assert bound_s(fixed, STEP, {STEP: 100.0}) == 20  # fixed means fixed
    assert bound_s(fixed, VALIDATION, {}) == 20
    assert bound_s(fixed, START, {}) == 60  # the start alone gets the warm-up factor
    off = StallRule(timeout_s=0)
    assert not off.enabled and bound_s(off, STEP, {}) == 0
    assert "run.step_timeout_s=20" in fixed.describe() and "stall_floor_s=300" in AUTO.describe()


def beat(step: int, entered: int, phase: str, time: float = 100.0, stalled: bool = False) -> Beat:
    return Beat(step, entered, time, stalled, "node1", 4242, phase)


def test_heartbeat_record_round_trips_and_is_fixed_width() -> None:
    b = beat(12, 2, "allreduce hpcdp.train_metrics", 1700000000.25, True)
    data = format_beat(b)
    assert len(data) == RECORD_BYTES and data.endswith(b"\n")
    assert parse_beat(data) == b
    long = beat(1, 0, "x" * 1000)
    assert len(format_beat(long)) == RECORD_BYTES  # a long phase is cut, not spilled


@pytest.mark.parametrize("data", [b"", b"   \n", b"12 0 17.5 0 host", b"a b c d e f g",
                                  b"\x00" * RECORD_BYTES])
def test_torn_or_foreign_heartbeats_read_as_none(data: bytes) -> None:
    assert parse_beat(data) is None


def test_laggards_are_the_ranks_with_the_lowest_step_and_collective_count() -> None:
    # rank 1 stalls in its data loader; ranks 0 and 2 wait in the gradient all-reduce
    beats = {0: beat(5, 1, "allreduce gradients"), 1: beat(5, 0, "data"),
             2: beat(5, 1, "allreduce gradients")}
    assert laggards(beats) == [1]
    # rank 1 stalled before the step's first collective while the others went one step on
    assert laggards({0: beat(6, 1, "allreduce gradients"), 1: beat(5, 0, "backward")}) == [1]
    # everyone at the same point: nobody is behind
    assert laggards({0: beat(5, 0, "data"), 1: beat(5, 0, "data")}) == []
    assert laggards({}) == []


def test_report_names_the_laggard_and_its_phase_first() -> None:
    beats = {0: beat(5, 1, "allreduce gradients", 100.0), 1: beat(5, 0, "data", 99.0)}
    text = report(beats, 2, now=100.5)
    assert text.startswith("rank 1 did not reach the point the others wait at: "
                           "rank 1 (node1 pid 4242) in step 5, data; the others: rank 0")
    assert "allreduce gradients" in text and "no heartbeat" not in text


def test_report_groups_ranks_and_lists_the_silent_ones() -> None:
    beats = {r: beat(7, 2, "allreduce hpcdp.train_metrics") for r in (0, 1, 2, 4, 5)}
    beats[3] = beat(7, 1, "optimizer", time=10.0)
    text = report(beats, 8, now=100.0)
    assert text.startswith("rank 3 did not reach")
    assert "silent 90 s" in text  # its watchdog thread stopped writing too
    assert "ranks 0-2,4-5 in step 7, allreduce hpcdp.train_metrics" in text
    assert text.endswith("no heartbeat from ranks 6-7 (dead, hung before its first heartbeat, "
                         "or the run folder is not shared between nodes)")
    same = report({0: beat(3, 0, "data"), 1: beat(3, 0, "data")}, 2, now=100.0)
    assert same == "no rank is behind the others: ranks 0-1 in step 3, data"
    assert report({}, 2, now=0.0).startswith("no heartbeat of any rank could be read")


def test_rank_list_and_reporters() -> None:
    assert rank_list([5, 0, 1, 2, 8, 7]) == "0-2,5,7-8"
    assert rank_list([3]) == "3" and rank_list([]) == ""
    assert reporters(8) is None  # small jobs: every rank reads every heartbeat
    assert reporters(1000) == {0, 333, 666, 999}


# --------------------------------------------------------------------------- config


def test_horovod_stall_shutdown_below_the_check_time_is_refused() -> None:
    why = horovod_stall_error(HorovodConfig(stall_shutdown_s=30), {})
    assert why is not None
    assert "horovod.stall_shutdown_s=30 is below the stall check time (Horovod's default " \
           "HOROVOD_STALL_CHECK_TIME_SECONDS=60)" in why
    assert "horovod.stall_check_s to at most 30" in why
    why = horovod_stall_error(HorovodConfig(stall_check_s=20, stall_shutdown_s=10), {})
    assert why is not None and "(horovod.stall_check_s=20)" in why
    why = horovod_stall_error(HorovodConfig(stall_shutdown_s=90),
                              {"HOROVOD_STALL_CHECK_TIME_SECONDS": "120"})
    assert why is not None and "(HOROVOD_STALL_CHECK_TIME_SECONDS=120)" in why
    why = horovod_stall_error(HorovodConfig(), {"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "5"})
    assert why is not None and why.startswith("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=5 is below")


@pytest.mark.parametrize(("hc", "env"), [
    (HorovodConfig(), {}),
    (HorovodConfig(stall_check_s=2, stall_shutdown_s=8), {}),
    (HorovodConfig(stall_check_s=30, stall_shutdown_s=30), {}),  # equal is honoured
    (HorovodConfig(stall_shutdown_s=60), {}),
    (HorovodConfig(stall_shutdown_s=30), {"HOROVOD_STALL_CHECK_TIME_SECONDS": "10"}),
    (HorovodConfig(stall_check_s=10), {"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "0"}),
])
def test_consistent_horovod_stall_settings_pass(hc: HorovodConfig, env: dict[str, str]) -> None:
    assert horovod_stall_error(hc, env) is None


def test_horovod_stall_settings_must_be_whole_seconds() -> None:
    why = horovod_stall_error(HorovodConfig(stall_check_s=2.5), {})
    assert why == "horovod.stall_check_s=2.5: Horovod reads whole seconds; use an integer"
    why = horovod_stall_error(HorovodConfig(), {"HOROVOD_STALL_CHECK_TIME_SECONDS": "1m"})
    assert why is not None and "'1m' in the environment" in why


@pytest.mark.parametrize(("override", "needle"), [
    ("horovod.stall_shutdown_s=30", "horovod.stall_shutdown_s=30 is below the stall check"),
    ("run.stall_floor_s=0", "run.stall_floor_s=0: must be positive"),
    ("run.stall_multiple=0.5", "run.stall_multiple=0.5: must be at least 1"),
    ("run.stall_warmup_factor=0", "run.stall_warmup_factor=0: must be at least 1"),
])
def test_config_refuses_bad_stall_keys(override: str, needle: str,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HOROVOD_STALL_CHECK_TIME_SECONDS", raising=False)
    monkeypatch.delenv("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", raising=False)
    with pytest.raises(ConfigError, match=needle):
        cfgmod.build(None, ["data.path=/data", override])


def test_watchdog_is_on_by_default_and_any_bound_is_accepted() -> None:
    cfg = cfgmod.build(None, ["data.path=/data"])
    assert cfg.run.step_timeout_s < 0 and cfg.run.stall_floor_s == 300
    for value in ("0", "20", "-1"):
        cfgmod.build(None, ["data.path=/data", f"run.step_timeout_s={value}"])
