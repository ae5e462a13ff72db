"""hpcdp.bench.processes: plain processes started together, bounded in time."""

from __future__ import annotations

import os
import sys
import time

import pytest

from hpcdp.bench.processes import run_together


def _py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_processes_run_at_once_each_with_its_environment() -> None:
    # Each waits 2 s: one after the other would take 4 s and more.
    code = "import os, time; time.sleep(2.0); print('me', os.environ['WHO'])"
    envs = [dict(os.environ, WHO=str(i)) for i in range(2)]
    done = run_together([_py(code)] * 2, envs, timeout=30, label="rank")
    assert done.ok, done.output
    assert done.seconds < 3.8, done.seconds
    assert "--- rank 0 (exit 0)\nme 0" in done.output and "--- rank 1 (exit 0)\nme 1" in done.output


def test_one_failure_fails_the_set() -> None:
    env = dict(os.environ)
    done = run_together([_py("pass"), _py("raise SystemExit(3)")], [env, env], timeout=30)
    assert not done.ok
    assert "--- process 1 (exit 3)" in done.output


def test_the_bound_kills_every_process() -> None:
    env = dict(os.environ)
    start = time.monotonic()
    done = run_together([_py("import time; time.sleep(60)"), _py("pass")], [env, env],
                        timeout=1.0)
    assert not done.ok and time.monotonic() - start < 10
    assert "killed after the 1s bound" in done.output


def test_each_command_needs_an_environment() -> None:
    with pytest.raises(ValueError, match="2 commands but 1 environments"):
        run_together([_py("pass")] * 2, [dict(os.environ)], timeout=5)


def test_each_process_starts_bound_to_its_cpus() -> None:
    mine = sorted(os.sched_getaffinity(0))
    code = "import os; print('cpus', sorted(os.sched_getaffinity(0)))"
    env = dict(os.environ)
    done = run_together([_py(code)] * 2, [env, env], timeout=30,
                        cpus=[frozenset(mine[:1]), None])
    assert done.ok, done.output
    assert f"--- process 0 (exit 0)\ncpus {mine[:1]}" in done.output
    assert f"--- process 1 (exit 0)\ncpus {mine}" in done.output  # None: the parent's mask
    with pytest.raises(ValueError, match="2 commands but 1 CPU sets"):
        run_together([_py("pass")] * 2, [env, env], timeout=30, cpus=[None])
