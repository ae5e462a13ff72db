"""The watchdog thread: quiet while progress is made, then a report naming who is behind.

Real threads and files, tiny bounds; no MPI (the abort is a callback here).
"""

from __future__ import annotations

import io
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from hpcdp.runtime import stall, watchdog
from hpcdp.runtime.stall import PREFIX, Beat, StallRule

FIXED = StallRule(timeout_s=0.5, warmup_factor=1.0)


@pytest.fixture(autouse=True)
def fresh_progress(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(watchdog, "_stalled", False)  # a stall fired here ends with the test
    watchdog.progress.restart(time.monotonic())
    yield
    watchdog.progress.restart(time.monotonic())
    watchdog.progress.hook = None


def dog(tmp_path: Path, rank: int, size: int, fired: threading.Event, out: io.StringIO,
        rule: StallRule = FIXED) -> watchdog.Watchdog:
    (tmp_path / "run").mkdir(exist_ok=True)
    return watchdog.Watchdog(rule, rank, size, tmp_path / "run" / "heartbeat", fired.set,
                             tick_s=0.1, grace_s=0.0, backstop_s=30.0, out=out)


def test_quiet_while_beating_then_fires_naming_the_rank_behind(tmp_path: Path) -> None:
    fired, out = threading.Event(), io.StringIO()
    d = dog(tmp_path, rank=0, size=3, fired=fired, out=out).start()
    try:
        for step in range(8):  # beating keeps it quiet
            watchdog.beat(step)
            watchdog.phase("data")
            time.sleep(0.1)
        assert not fired.is_set()
        assert (tmp_path / "run" / "heartbeat" / "rank-00000").exists()  # its heartbeat
        # rank 1 is stuck in its data loader at step 8 (its heartbeat as it would write it)
        (tmp_path / "run" / "heartbeat" / "rank-00001").write_bytes(
            stall.format_beat(Beat(8, 0, time.time(), False, "node2", 99, "data")))
        watchdog.beat(8)
        with watchdog.waiting("allreduce hpcdp.x"):  # rank 0 now waits in a collective...
            assert fired.wait(5.0)  # ...until the bound
    finally:
        d.stop()
    text = out.getvalue()
    first = next(line for line in text.splitlines() if line.startswith(PREFIX))
    assert first.startswith(f"{PREFIX} rank 1 did not reach the point the others wait at: "
                            "rank 1 (node2 pid 99) in step 8, data; the others: rank 0")
    assert "allreduce hpcdp.x" in first and "no heartbeat from rank 2" in first
    assert re.search(r"seen by rank 0: no progress for [0-9.]+ s in step \(bound 0\.5 s, "
                     r"run\.step_timeout_s=0\.5\); aborting the job\]$", first), first
    assert "[hpcdp rank 0] stalled at step 8 in allreduce hpcdp.x (1 collective(s) entered" \
        in text
    assert "test_quiet_while_beating_then_fires" in text  # the main thread's stack
    own = stall.parse_beat((tmp_path / "run" / "heartbeat" / "rank-00000").read_bytes())
    assert own is not None and own.stalled and own.step == 8
    assert (tmp_path / "run" / "heartbeat" / "stalled").read_text() == "0\n"
    assert watchdog.stalled()


def test_a_peers_stall_mark_makes_a_waiting_rank_report_too(tmp_path: Path) -> None:
    fired, out = threading.Event(), io.StringIO()
    rule = StallRule(timeout_s=2.0, warmup_factor=1.0)
    folder = tmp_path / "run" / "heartbeat"
    folder.mkdir(parents=True)
    d = dog(tmp_path, rank=1, size=2, fired=fired, out=out, rule=rule)
    (folder / "stalled").write_text("0\n")  # rank 0 fired first
    watchdog.beat(3)
    start = time.monotonic()
    d.start()
    try:
        assert fired.wait(4.0)
    finally:
        d.stop()
    assert 1.0 <= time.monotonic() - start < 2.0  # past half the bound, before the bound
    assert "rank 0 reported a stall" in out.getvalue()


def test_no_run_folder_yet_means_no_heartbeat_and_no_harm(tmp_path: Path) -> None:
    fired, out = threading.Event(), io.StringIO()
    d = watchdog.Watchdog(FIXED, 0, 1, tmp_path / "absent" / "heartbeat", fired.set,
                          tick_s=0.1, grace_s=0.0, out=out).start()
    try:
        assert fired.wait(5.0)
    finally:
        d.stop()
    assert not (tmp_path / "absent").exists()  # rank 0 makes the run dir, not the watchdog
    assert f"{PREFIX} no rank is behind the others: rank 0" in out.getvalue()


def test_nothing_is_written_before_the_first_step(tmp_path: Path) -> None:
    """A run refused in setup leaves an existing run folder as it was."""
    fired, out = threading.Event(), io.StringIO()
    d = dog(tmp_path, rank=0, size=2, fired=fired, out=out).start()  # stalls in "start"
    try:
        assert fired.wait(5.0)
    finally:
        d.stop()
    assert list((tmp_path / "run").iterdir()) == []
    assert "stalled at step -1 in start" in out.getvalue()


def test_intervals_are_timed_by_kind() -> None:
    p = watchdog.progress
    watchdog.beat(0)
    time.sleep(0.05)
    watchdog.section("checkpoint")
    time.sleep(0.12)
    watchdog.beat(1)
    assert p.interval[0] == "step" and p.step == 1 and p.phase == "step start"
    assert p.slowest["step"] >= 0.05 and p.slowest["checkpoint"] >= 0.12
    assert p.slowest["step"] < p.slowest["checkpoint"]
    watchdog.enter_collective("allreduce gradients")
    with watchdog.waiting("allgather hpcdp.busy"):
        assert (p.entered, p.phase) == (2, "allgather hpcdp.busy")
    assert p.phase == "after allgather hpcdp.busy"


BACKSTOP = """
import ctypes, sys, threading
from pathlib import Path
from hpcdp.runtime import watchdog
from hpcdp.runtime.stall import StallRule
d = watchdog.Watchdog(StallRule(timeout_s=1.0, warmup_factor=1.0), 0, 1, None, lambda: None,
                      backstop_s=1.0).start()
print("holding the GIL", flush=True)
ctypes.PyDLL(None).sleep(30)  # a C call that keeps the GIL: the watchdog thread starves
print("not reached", flush=True)
"""


def test_backstop_ends_a_process_whose_main_thread_holds_the_gil() -> None:
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-c", BACKSTOP], capture_output=True, text=True,
                          timeout=60)
    took = time.monotonic() - start
    assert done.returncode == 1, done
    assert "holding the GIL" in done.stdout and "not reached" not in done.stdout
    assert "Timeout (" in done.stderr and "<string>" in done.stderr  # the stuck line's stack
    assert took < 20, took
