"""A torch.profiler trace of the steps `run.profile` names, one file per rank.

Each chosen rank writes <run dir>/profiles/rank<R>-<host>.pt.trace.json, a Chrome
trace that Perfetto (ui.perfetto.dev) and TensorBoard's profiler plugin open; every
step in it is a range named `hpcdp step N`, and the file's top-level `hpcdp` entry
names the rank, the host and the steps. Between steps the profiler sees what the
loop does there (the metrics all-reduce, the preemption check, a checkpoint), so
each step's range holds all of its time. The profiler runs from the first chosen
step's start to the last one's end; a run that stops inside the range (preemption,
the last step) writes what it recorded, and a run resumed past the first step
records nothing.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from hpcdp.profile_spec import ProfileSpec

log = logging.getLogger("hpcdp.train")


def trace_path(run_dir: Path, rank: int, host: str) -> Path:
    return run_dir / "profiles" / f"rank{rank}-{host}.pt.trace.json"


class StepProfiler:
    """Starts, labels and stops torch.profiler at step boundaries; writes one trace."""

    def __init__(self, spec: ProfileSpec, rank: int, run_dir: Path, cuda: bool) -> None:
        self.spec, self.rank, self.host = spec, rank, socket.gethostname()
        self.path = trace_path(run_dir, rank, self.host)
        self.cuda = cuda
        self._prof: Any = None
        self._label: AbstractContextManager[Any] | None = None

    def before_step(self, step: int) -> None:
        """At the start of the step the loop counts `step` (0-based; the logs say step + 1)."""
        number = step + 1
        if self._prof is None:
            if number == self.spec.first:
                self._start()
                self._open_label(number)
            return
        self._close_label()
        if number > self.spec.last:
            self.close()
        else:
            self._open_label(number)

    def close(self) -> None:
        """Stop and write the trace, if one is being recorded (the run's end, or the range's)."""
        if self._prof is None:
            return
        self._close_label()
        prof, self._prof = self._prof, None
        prof.stop()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_name(self.path.name + ".part")
        prof.export_chrome_trace(str(partial))
        os.replace(partial, self.path)  # a reader never opens half a trace
        log.info(f"profile of steps {self.spec.first}-{self.spec.last} written: {self.path} "
                 f"({self.path.stat().st_size / 1e6:.1f} MB)")

    def _start(self) -> None:
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
        self._prof = profile(activities=activities, record_shapes=self.spec.shapes,
                             with_stack=self.spec.stacks)
        self._prof.start()
        self._prof.add_metadata_json("hpcdp", json.dumps({
            "rank": self.rank, "host": self.host,
            "steps": [self.spec.first, self.spec.last]}))

    def _open_label(self, number: int) -> None:
        self._label = record_function(f"hpcdp step {number}")
        self._label.__enter__()

    def _close_label(self) -> None:
        if self._label is not None:
            self._label.__exit__(None, None, None)
            self._label = None


def for_rank(spec: ProfileSpec | None, rank: int, run_dir: Path,
             device: str) -> StepProfiler | None:
    """This rank's profiler, or None when run.profile is off or leaves the rank out."""
    if spec is None or not spec.covers(rank):
        return None
    return StepProfiler(spec, rank, run_dir, device != "cpu" and torch.cuda.is_available())
