"""The stall bound of a preparation rank: the rule, the marks, and the guard ending a
process that works without progress (one process; several ranks: tests/parallel)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from hpcdp.data.prep import frame, stall
from hpcdp.data.prep.world import SerialComm


def test_only_working_time_over_the_bound_is_a_stall() -> None:
    state = stall.Marks(doing="reading", since=100.0)
    assert stall.overdue(state, 105.0, 10.0) is None
    assert stall.overdue(state, 111.0, 10.0) == 11.0
    assert stall.overdue(state, 111.0, 0.0) is None  # off
    state.waiting = "in allgather"
    assert stall.overdue(state, 1000.0, 10.0) is None  # waiting for the others: theirs


def test_a_wait_is_marked_while_it_lasts_and_leaving_it_is_progress() -> None:
    stall.marks.since = 0.0
    with stall.waiting("in a barrier"):
        assert stall.marks.waiting == "in a barrier"
        with stall.waiting("in bcast"):
            assert stall.marks.waiting == "in bcast"
        assert stall.marks.waiting == "in a barrier"
    assert stall.marks.waiting is None and time.monotonic() - stall.marks.since < 1.0
    stall.mark("writing")
    assert stall.marks.doing == "writing"


def test_a_watched_communicator_marks_its_collectives_as_waits() -> None:
    seen = []

    class Comm(SerialComm):
        def allgather(self, value):
            seen.append(stall.marks.waiting)
            return [value]

        def Dup(self):  # noqa: N802 - mpi4py's name
            seen.append(stall.marks.waiting)
            return self

        def Get_name(self):  # noqa: N802 - mpi4py's name
            seen.append(stall.marks.waiting)
            return "world"

    comm = stall.Watched(Comm())
    assert comm.allgather(3) == [3] and comm.rank == 0 and comm.size == 1
    comm.Dup()
    assert comm.Get_name() == "world"
    assert seen == ["in allgather", "in Dup", None]  # a name is no collective
    assert isinstance(stall.raw(comm), Comm) and stall.raw(seen) is seen


def test_the_option_takes_seconds_and_zero_turns_it_off() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    frame.add_common_options(parser)
    assert parser.parse_args([]).stall_timeout == stall.DEFAULT_BOUND_S
    assert parser.parse_args(["--stall-timeout", "0"]).stall_timeout == 0
    for bad in ("-1", "nan", "soon"):
        with pytest.raises(SystemExit):
            parser.parse_args(["--stall-timeout", bad])


#: A process under the guard (bound argv[1] s) that works argv[2] s in one go, or marks
#: progress every 0.1 s ("marks"), or waits ("waits").
GUARDED = """
import sys, time
from hpcdp.data.prep import stall, world
bound, seconds, how = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
with stall.guarded(world.SerialComm(), "prep-test", bound):
    stall.mark("reading block 7 of the corpus")
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if how == "marks":
            stall.mark()
        if how == "waits":
            with stall.waiting("in allgather"):
                time.sleep(0.1)
        else:
            time.sleep(0.1)
print("finished")
"""


def guarded(bound: float, seconds: float, how: str) -> tuple[subprocess.CompletedProcess, float]:
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-c", GUARDED, str(bound), str(seconds), how],
                          capture_output=True, text=True, timeout=60, check=False)
    return done, time.monotonic() - start


def test_a_rank_working_past_the_bound_ends_naming_itself_and_what_it_did() -> None:
    done, took = guarded(1.0, 30.0, "works")
    assert done.returncode == stall.EXIT_STALLED, done.stderr
    assert took < 15 and "finished" not in done.stdout
    assert "prep-test: stall: rank 0 on " in done.stderr
    assert "without progress (--stall-timeout 1); its last: reading block 7 of the corpus;" \
        in done.stderr
    assert 'File "<string>", line 15 in <module>' in done.stderr  # its stack: the sleep


@pytest.mark.parametrize("how", ["marks", "waits"])
def test_progress_or_waiting_is_no_stall(how: str) -> None:
    done, _ = guarded(1.0, 3.0, how)
    assert done.returncode == 0 and "finished" in done.stdout, done.stderr
