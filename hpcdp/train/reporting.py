"""Rank-0 reporting: log lines, JSONL records, TensorBoard scalars, a progress bar.

Other ranks get the same objects with every sink switched off, so the loop calls
them unconditionally and no `if rank == 0` is scattered through it. Values
passed here must already be averaged across ranks (the loop does that).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from hpcdp.train.tracking.hub import Trackers

log = logging.getLogger("hpcdp")


def setup_logging(run_dir: Path | None, active: bool) -> None:
    """Plain lines to stdout and to <run dir>/train.log on rank 0; warnings only elsewhere."""
    root = logging.getLogger("hpcdp")
    root.handlers.clear()
    root.propagate = False
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%H:%M:%S")
    out = logging.StreamHandler(sys.stdout)
    out.setFormatter(fmt)
    root.addHandler(out)
    if active and run_dir is not None:
        run_dir.mkdir(parents=True, exist_ok=True)
        fh = logging.FileHandler(run_dir / "train.log")
        fh.setFormatter(fmt)
        root.addHandler(fh)
    root.setLevel(logging.INFO if active else logging.WARNING)


class StepSplit(NamedTuple):
    """Where one optimizer step's seconds went on this rank."""

    data: float  # the batch, until it is on the device
    compute: float  # forward and backward (on a GPU also the wait for its kernels)
    comm: float  # waits in collectives: the gradients' all-reduce left after backward, ...
    optimizer: float = 0.0  # the update: unscale, clip, the optimizers' step

    def folded(self) -> tuple[float, float, float]:
        """(data, compute, comm) as the log lines give them: the update counts as compute."""
        return self.data, self.compute + self.optimizer, self.comm


#: The per-rank window totals each train record carries (`ranks_<phase>_s`, seconds, in
#: rank order): what `hpcdp report` draws. `other` is the rest of the step's wall time
#: (the loop between steps, the hooks); checkpoints are outside it.
RANK_PHASES = ("data", "compute", "comm", "optimizer", "checkpoint", "other")


@dataclass
class StepTimes:
    """Where a window of steps spent its time, and how many samples it processed."""

    data: float = 0.0
    compute: float = 0.0
    comm: float = 0.0
    optimizer: float = 0.0
    checkpoint: float = 0.0  # writing checkpoints: left out of the wall time, as validation is
    samples: int = 0
    steps: int = 0
    started: float = field(default_factory=time.perf_counter)

    def add(self, split: StepSplit, samples: int) -> None:
        self.data += split.data
        self.compute += split.compute
        self.comm += split.comm
        self.optimizer += split.optimizer
        self.samples += samples
        self.steps += 1

    def exclude(self, seconds: float, checkpoint: bool = False) -> float:
        """Leave out time spent outside training steps (validation, checkpoints)."""
        self.started += seconds
        if checkpoint:
            self.checkpoint += seconds
        return seconds

    def wall(self) -> float:
        return max(time.perf_counter() - self.started, 1e-9)

    def summary(self) -> dict[str, float]:
        """Per-step averages in ms and throughput over the window's wall time."""
        wall = self.wall()
        n = max(self.steps, 1)
        return {
            "samples_per_s": self.samples / wall,
            "step_ms": 1000 * wall / n,
            "data_ms": 1000 * self.data / n,
            "compute_ms": 1000 * (self.compute + self.optimizer) / n,
            "optimizer_ms": 1000 * self.optimizer / n,
            "comm_ms": 1000 * self.comm / n,
            # The rank's own share of a step: all but its waits in collectives. Step
            # times are alike on every rank (each waits for the slowest); this is not.
            "busy_ms": 1000 * max(wall - self.comm, 0.0) / n,
        }

    def phase_seconds(self) -> list[float]:
        """This rank's window totals in RANK_PHASES order (seconds; pure but for the clock)."""
        wall = self.wall()
        other = max(wall - self.data - self.compute - self.comm - self.optimizer, 0.0)
        return [self.data, self.compute, self.comm, self.optimizer, self.checkpoint, other]


def rank_fields(rows: list[list[float]]) -> dict[str, list[float]]:
    """Every rank's phase_seconds (in rank order) -> the train record's per-rank lists."""
    return {f"ranks_{phase}_s": [row[i] for row in rows] for i, phase in enumerate(RANK_PHASES)}


def rank_spread(values: list[float]) -> dict[str, float]:
    """Per-rank busy times -> the fastest, the slowest and who (for stragglers; pure)."""
    slowest = max(range(len(values)), key=values.__getitem__)
    return {"busy_ms_min": min(values), "busy_ms_max": values[slowest],
            "slowest_rank": slowest}


def spread_text(spread: dict[str, float]) -> str:
    """' | busy/rank 10.1-15.3 ms (slowest: rank 1)', or '' with one rank's numbers."""
    if not spread:
        return ""
    return (f" | busy/rank {spread['busy_ms_min']:.1f}-{spread['busy_ms_max']:.1f} ms "
            f"(slowest: rank {int(spread['slowest_rank'])})")


class Reporter:
    """Sinks for one run; all switched off unless `active` (rank 0)."""

    def __init__(self, run_dir: Path, active: bool, jsonl: bool, tensorboard: bool,
                 progress: bool, total_steps: int, initial_step: int,
                 drop_after: int | None = None, trackers: Trackers | None = None) -> None:
        self.active = active
        self._trackers = trackers if active else None
        self.jsonl_path = run_dir / "metrics.jsonl"
        self.tb_dir = run_dir / "tensorboard"
        self._jsonl = None
        self._tb = None
        self._bar = None
        if not active:
            return
        run_dir.mkdir(parents=True, exist_ok=True)
        if jsonl:
            if drop_after is not None:
                drop_records_after(self.jsonl_path, drop_after)
            self._jsonl = self.jsonl_path.open("a", encoding="utf-8")
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(self.tb_dir), purge_step=initial_step or None)
        if progress and sys.stderr.isatty():
            from tqdm import tqdm

            self._bar = tqdm(total=total_steps, initial=initial_step, unit="step",
                             dynamic_ncols=True, file=sys.stderr)

    def record(self, kind: str, step: int, values: dict[str, Any]) -> None:
        """One JSONL line and one TensorBoard scalar per numeric value."""
        if not self.active:
            return
        now = time.time()
        if self._jsonl is not None:
            self._jsonl.write(json.dumps({"kind": kind, "step": step, "time": now,
                                          **values}) + "\n")
            self._jsonl.flush()
        if self._trackers is not None:
            self._trackers.record(kind, step, values, now)
        if self._tb is not None:
            for key, value in values.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    self._tb.add_scalar(f"{kind}/{key}", value, step)

    def checkpointed(self, step: int) -> None:
        """A checkpoint of `step` is written: trackers get the records it covers."""
        if self._trackers is not None:
            self._trackers.committed(step)

    def ended(self, summary: dict[str, Any] | None, stopped: str | None = None) -> None:
        """The run finished with `summary`, or `stopped` (preempted) for a requeue."""
        if self._trackers is not None:
            self._trackers.end(summary, stopped)

    def advance(self, steps: int = 1, **postfix: float) -> None:
        if self._bar is not None:
            self._bar.update(steps)
            if postfix:
                self._bar.set_postfix({k: f"{v:.4g}" for k, v in postfix.items()}, refresh=False)

    def info(self, message: str) -> None:
        """A log line that does not tear the progress bar."""
        if not self.active:
            return
        if self._bar is not None:
            self._bar.clear()
        log.info(message)
        if self._bar is not None:
            self._bar.refresh()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        if self._tb is not None:
            self._tb.close()
        if self._jsonl is not None:
            self._jsonl.close()
        if self._trackers is not None:
            self._trackers.close()  # bounded: run.tracker_close_timeout_s


def drop_records_after(path: Path, step: int) -> None:
    """On resume: forget what the interrupted run logged after its checkpoint's step.

    Those steps are trained again, so keeping both copies would double them in
    every plot. Rewritten atomically (temp file, rename).
    """
    if not path.exists():
        return
    keep = [line for line in path.read_text().splitlines()
            if line.strip() and json.loads(line).get("step", 0) <= step]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(line + "\n" for line in keep))
    tmp.replace(path)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """All records of a metrics file (for summaries and tests)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
