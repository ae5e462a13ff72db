"""Stalls and stragglers under real launchers (docs/stalls.md).

A rank stalled in its data loader, in forward, or just before a collective: with the
default (auto) watchdog and a small floor, the job ends within the bound plus 30 s,
and the first `hpcdp stall:` line of the job's output names the stalled rank and
what it was doing. A rank that is only slow shows in the per-rank busy times of the
periodic log, and the job finishes.
"""

from __future__ import annotations

import json
import re
import socket
import sys
import time
from pathlib import Path

import pytest

from hpcdp.runtime.stall import PREFIX
from hpcdp.train import profiling, report_command
from hpcdp.train.reporting import read_jsonl
from hpcdp.train.time_split import rank_times

pytestmark = pytest.mark.parallel

TRAIN = [sys.executable, "-m", "hpcdp.train"]
N_TRAIN, N_VAL = 320, 64  # batch 16 per rank, 2 ranks: 10 steps
FLOOR = 5.0  # run.stall_floor_s: the bound once steps are measured (they take milliseconds)
TAG = re.compile(r"^\[\d+(?:,\d+)?\]<std(?:out|err)>:")  # mpirun, horovodrun --gloo


RUN_SETTINGS = (  # after the args fixture's SMALL_RUN; a later value of a key wins
    "log.every_steps=2", "run.epochs=1", f"run.stall_floor_s={FLOOR:g}",
    # the start (imports done, init to the first step) on a loaded machine
    "run.stall_warmup_factor=8",
)
RUN_COMMAND = TRAIN


def first_stall_line(output: str) -> str:
    for line in output.splitlines():
        line = TAG.sub("", line)
        if line.startswith(PREFIX):
            return line
    raise AssertionError(f"no {PREFIX!r} line in:\n{output}")


@pytest.mark.parametrize(
    ("launcher", "phase", "shown"),
    [
        ("mpirun", "data", "data"),
        ("mpirun", "forward", "forward"),
        # stalled just before the gradient wait: backward already sent its gradients,
        # so rank 0 finishes step 5 and waits in step 6 for rank 1, still in backward
        ("mpirun", "collective", "step 5, backward"),
        ("horovodrun", "forward", "forward"),
        ("horovodrun-gloo", "data", "data"),
    ],
)
def test_stalled_rank_is_named_and_the_job_ends(args, ranks, data: Path, tmp_path: Path,
                                                launcher: str, phase: str, shown: str) -> None:
    fault = f"stall:rank=1:step=5:seconds=600:phase={phase}"
    run = ranks(args(data, tmp_path / "run"), np=2, launcher=launcher, timeout=120,
                env={"HPCDP_FAULT": fault}, expect_ok=False)
    ended = time.time()
    out = run.output
    assert not run.timed_out and run.returncode != 0, run.describe()
    began = float(re.search(rf"rank 1 stalls for 600 s at step 5, phase {phase} "
                            r"\(unix time ([0-9.]+)\)", out).group(1))
    assert ended - began < FLOOR + 30, run.describe()
    first = first_stall_line(out)
    assert first.startswith(f"{PREFIX} rank 1 did not reach the point the others wait at: "
                            "rank 1 ("), first
    assert f"{shown}; the others: rank 0" in first, first
    for rank in (0, 1):  # every rank wrote where it was, with its threads' stacks
        assert f"[hpcdp rank {rank}] stalled at step" in out, out
    assert "Most recent call first" in out or "most recent call first" in out, out


def test_straggler_shows_in_the_log_and_the_job_finishes(args, ranks, data: Path,
                                                          tmp_path: Path) -> None:
    """The same run also records both ranks' profiles of two steps (docs/profiling.md), and
    `hpcdp report`'s picture of where each rank's time went shows rank 1 tallest."""
    run_dir = tmp_path / "run"
    out = ranks(args(data, run_dir, "run.epochs=2", "run.profile=steps=3-4"), np=2,
                timeout=120, env={"HPCDP_FAULT": "slow:rank=1:factor=3"}).output
    assert re.search(r"busy/rank [0-9.]+-[0-9.]+ ms \(slowest: rank 1\)", out), out
    windows = [r for r in read_jsonl(run_dir / "metrics.jsonl") if r["kind"] == "train"]
    assert len(windows) == 10
    late = windows[1:]  # the first window holds the warm-up
    assert sum(w["slowest_rank"] == 1 for w in late) >= len(late) - 2, windows
    assert sum(w["busy_ms_max"] > 1.5 * w["busy_ms_min"] for w in late) >= len(late) - 2, windows
    assert PREFIX not in out and (run_dir / "summary.json").exists()
    check_profiles(run_dir)
    check_time_picture(run_dir)


def check_profiles(run_dir: Path) -> None:
    """One loadable trace per rank, naming its rank and host, holding the steps chosen."""
    host = socket.gethostname()
    assert sorted(p.name for p in (run_dir / "profiles").iterdir()) == [
        f"rank0-{host}.pt.trace.json", f"rank1-{host}.pt.trace.json"]
    for rank in (0, 1):
        trace = json.loads(profiling.trace_path(run_dir, rank, host).read_text())
        assert trace["hpcdp"] == {"rank": rank, "host": host, "steps": [3, 4]}
        names = {e.get("name", "") for e in trace["traceEvents"]}
        assert {"hpcdp step 3", "hpcdp step 4"} <= names and "hpcdp step 5" not in names
        assert any(n.startswith("aten::convolution") for n in names), sorted(names)[:20]


def check_time_picture(run_dir: Path) -> None:
    """`hpcdp report RUN` draws the picture; its bars (read back from the figure's Axes):
    rank 1's own time is the tallest, and it waits least in the all-reduce."""
    assert report_command.main([str(run_dir)]) == 0
    assert (run_dir / "time.png").read_bytes().startswith(b"\x89PNG")
    times = rank_times(read_jsonl(run_dir / "metrics.jsonl"))
    (ax,) = report_command.draw(times, "straggler").axes
    tops, waits = report_command.bars(ax)
    assert tops[1] > 1.5 * tops[0], (tops, times)
    assert waits[1] < waits[0], (waits, times)
