"""Start several plain processes at once (no MPI launcher) and bound them in time.

The benchmarks' references run this way: the ceiling (W independent 1-rank
trainings), the torch DDP ranks (a process group of their own) and the bare
loops. Each process gets its own session so that a timeout kills it and
everything it started.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hpcdp.runtime.launcher import kill_group


@dataclass(frozen=True)
class Together:
    """What a set of processes started at once left: their exit, output and time."""

    ok: bool  # every process exited 0 within the bound
    output: str  # each process's output in turn, headed by its index and exit status
    seconds: float


def run_together(argvs: Sequence[Sequence[str]], envs: Sequence[Mapping[str, str]],
                 timeout: float, label: str = "process",
                 cpus: Sequence[frozenset[int] | None] | None = None) -> Together:
    """Start `argvs[i]` with `envs[i]` for every i at once; kill them all at `timeout`.

    `label` names each process in the output ('rank' for a process group);
    `cpus[i]`, where given, is the CPU set process i starts bound to.
    """
    if len(argvs) != len(envs):
        raise ValueError(f"{len(argvs)} commands but {len(envs)} environments")
    masks = list(cpus) if cpus is not None else [None] * len(argvs)
    if len(masks) != len(argvs):
        raise ValueError(f"{len(argvs)} commands but {len(masks)} CPU sets")
    start = time.monotonic()
    procs = [subprocess.Popen(list(argv), env=dict(env), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, start_new_session=True,
                              preexec_fn=_binder(mask))
             for argv, env, mask in zip(argvs, envs, masks, strict=True)]
    deadline = start + timeout
    outputs, ok = [], True
    for i, proc in enumerate(procs):
        try:
            out, _ = proc.communicate(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            for other in procs:
                kill_group(other.pid, grace=1.0)
            out, _ = proc.communicate()
            out += f"\n[hpcdp bench] killed after the {timeout:.0f}s bound\n"
        ok = ok and proc.returncode == 0
        outputs.append(f"--- {label} {i} (exit {proc.returncode})\n{out}")
    for proc in procs:  # whatever a process left running in its session
        kill_group(proc.pid, grace=0.0)
    return Together(ok, "\n".join(outputs), time.monotonic() - start)


def _binder(mask: frozenset[int] | None) -> Any:
    """A preexec_fn binding the child to `mask` (None: none; inherits the parent's)."""
    if mask is None:
        return None
    return lambda: os.sched_setaffinity(0, mask)
