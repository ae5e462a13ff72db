"""Callbacks around each step, outside the loop body: faults, stop_at_step, traces, watchdog,
profiles.

`HPCDP_FAULT` faults (hpcdp.runtime.faults), `run.stop_at_step` (checkpoint and stop as
if preempted), `log.trace_samples` (every rank writes a fingerprint of each
sample it trained on), the stall watchdog's beat (hpcdp.runtime.watchdog) and
`run.profile` (hpcdp.train.profiling: a torch.profiler trace of chosen steps). The loop
calls `before_step`, `on_batch` and `stop_reason`; with every option off they
cost a few attribute lookups.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, TextIO

import torch

from hpcdp import profile_spec
from hpcdp.config import Config
from hpcdp.runtime import faults, watchdog
from hpcdp.train import profiling


def fingerprints(x: torch.Tensor) -> list[str]:
    """A short hash of each sample's bytes: lets tests check which samples a rank saw."""
    arr = x.numpy()
    return [hashlib.blake2b(arr[i].tobytes(), digest_size=8).hexdigest() for i in range(len(arr))]


class Hooks:
    """The per-step callbacks of one rank."""

    def __init__(self, cfg: Config, rank: int, run_dir: Path) -> None:
        self.rank = rank
        self.stop_at = cfg.run.stop_at_step
        self.epoch = 0
        self.trace: TextIO | None = None
        if cfg.log.trace_samples:
            (run_dir / "trace").mkdir(parents=True, exist_ok=True)
            self.trace = (run_dir / "trace" / f"rank-{rank}.jsonl").open("a")
        self.on_batch = self._write_trace if self.trace is not None else None
        self.profiler = profiling.for_rank(profile_spec.parse(cfg.run.profile), rank, run_dir,
                                           cfg.run.device)

    def before_step(self, step: int) -> bool:
        """The watchdog's beat, the profiler's step boundary (run.profile), then any armed
        fault; True if this step's loss must be NaN."""
        watchdog.beat(step)
        if self.profiler is not None:
            self.profiler.before_step(step)
        return faults.inject(step, self.rank)

    def _write_trace(self, batch: Any, step: int) -> None:
        assert self.trace is not None
        record = {"epoch": self.epoch, "step": step, "ids": fingerprints(batch[0])}
        self.trace.write(json.dumps(record) + "\n")

    def stop_reason(self, step: int) -> str | None:
        """'stopped' at run.stop_at_step (the same on every rank), else None."""
        return "stopped" if self.stop_at and step == self.stop_at else None

    def close(self) -> None:
        if self.profiler is not None:
            self.profiler.close()  # a run that ended inside the profiled steps
        if self.trace is not None:
            self.trace.close()
