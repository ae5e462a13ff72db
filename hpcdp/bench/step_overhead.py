"""hpcdp's per-step overhead against a bare loop, measured inside one process.

`python -m hpcdp.bench.step_overhead [train overrides...]` builds a 1-rank run
the way `hpcdp train` does (hpcdp.train.setup.build) and times, in alternating
blocks on the same model, (a) hpcdp's step as the training loop runs it:
`train_step` (the task's prepare, the reader's hand-over, forward, backward,
the finite check, the update, metric sums) with the hooks, the step timers,
the preemption agreement and the metrics report every `log.every_steps`; and
(b) a bare step: zero_grad, forward, cross entropy, backward and an SGD step
(the config's settings, torch's default implementation) on one batch held in
memory, already converted; and (c) the same bare step with the SGD kernel
hpcdp's optimizer uses (optim.fused), which shows what hpcdp's own per-step
work costs apart from that choice. The sides share whatever load the machine
has, block by block, so the median of the per-block differences is the
overhead even where absolute step times move a lot between launches
(`hpcdp bench train` compares separate launches).

Prints one JSON line: median step ms of each side, the overhead in ms and as a
fraction of the bare step (against b, and against c), and hpcdp's
data/compute/comm split over its last full window of log.every_steps steps.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from hpcdp import config as cfgmod
from hpcdp import tasks
from hpcdp.runtime import dist
from hpcdp.runtime.preempt import Preemption
from hpcdp.tasks import fusable
from hpcdp.train import setup
from hpcdp.train.evaluate import MetricSums
from hpcdp.train.hooks import Hooks
from hpcdp.train.loop import agree_stop
from hpcdp.train.reporting import StepTimes
from hpcdp.train.step import train_step


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m hpcdp.bench.step_overhead",
                                description=__doc__.splitlines()[0])
    p.add_argument("--config", help="TOML config file, as for `hpcdp train`")
    p.add_argument("--blocks", type=int, default=10, help="blocks per side, alternating")
    p.add_argument("--steps", type=int, default=20, help="steps per block")
    p.add_argument("--warmup", type=int, default=10, help="untimed steps of each side first")
    p.add_argument("--label", default="", help="copied into the JSON line")
    p.add_argument("overrides", nargs="*", metavar="section.key=value")
    args = p.parse_intermixed_args(argv)
    if min(args.blocks, args.steps) < 1 or args.warmup < 0:
        p.error("--blocks and --steps must be positive, --warmup >= 0")
    return args


class HpcdpSide:
    """hpcdp's step and what the loop does around it on one rank (no checkpoints)."""

    def __init__(self, run: Any, cfg: Any, run_dir: Path) -> None:
        self.run, self.cfg = run, cfg
        self.hooks = Hooks(cfg, 0, run_dir)
        self.preempt = None
        if cfg.preempt.enabled and cfg.preempt.signals:
            self.preempt = Preemption(cfg.preempt.signals, cfg.preempt.check_every).install()
        self.sums = MetricSums(run.task.metrics, run.device, training=True)
        self.window = StepTimes()
        self.last_window: dict[str, float] = {}
        self.step = 0

    def batches(self) -> Any:
        """Batches without end: each epoch of the reader after the last."""
        epoch = 0
        while True:
            self.run.train_reader.set_epoch(epoch)
            yield from self.run.train_reader
            epoch += 1

    def steps(self, n: int, feed: Any) -> None:
        run = self.run
        for _ in range(n):
            lr = run.schedule.lr(self.step % max(run.total_steps, 1))
            nan = self.hooks.before_step(self.step)
            times = train_step(run, feed, lr, self.sums, self.step, nan, self.hooks.on_batch)
            self.step += 1
            self.window.add(times, run.batch * run.accum)
            if self.step % self.cfg.log.every_steps == 0:
                self.sums.reduce("train")
                self.last_window = self.window.summary()
                self.window = StepTimes()
            agree_stop(self.preempt, self.hooks, self.step)


def bare_stepper(run: Any, cfg: Any, batch: Any, fused: bool | None = None) -> Any:
    """The bare step on the run's model and `batch`, converted once and kept; `fused`
    as torch.optim.SGD takes it (None: torch's default implementation)."""
    inputs, targets = run.task.prepare(batch, cfg, run.device)
    o = cfg.optim
    opt = torch.optim.SGD(run.model.parameters(), lr=o.lr, momentum=o.momentum,
                          weight_decay=o.weight_decay, fused=fused)

    def step(n: int) -> None:
        for _ in range(n):
            opt.zero_grad()
            F.cross_entropy(run.model(inputs), targets).backward()
            opt.step()

    return step


def timed(fn: Any, n: int) -> float:
    t0 = time.perf_counter()
    fn(n)
    return 1000 * (time.perf_counter() - t0) / n


def measure(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="hpcdp-step-overhead-") as tmp:
        cfg = cfgmod.build(args.config, [f"run.dir={tmp}", "log.tensorboard=false",
                                         "log.progress=false", *args.overrides], tasks.defaults)
        task = tasks.get(cfg.task.name)
        dist.init(cfg.horovod, cfg.run_dir)
        run = setup.build(cfg, task, 0, 1, torch.device("cpu"))
        run.model.train()
        ours = HpcdpSide(run, cfg, Path(tmp))
        feed = ours.batches()
        first = next(feed)
        sides = [lambda n: ours.steps(n, feed), bare_stepper(run, cfg, first),
                 bare_stepper(run, cfg, first, fusable(cfg.optim.fused, run.model.parameters()))]
        for side in sides:
            side(args.warmup)
        rows = []
        for b in range(args.blocks):  # each side goes first in turn
            order = [(b + i) % len(sides) for i in range(len(sides))]
            times = {i: timed(sides[i], args.steps) for i in order}
            rows.append(tuple(times[i] for i in range(len(sides))))
        split = ours.last_window or ours.window.summary()
    return summarize(rows, split, args.label or cfg.model.name)


def summarize(rows: list[tuple[float, ...]], split: dict[str, float],
              label: str) -> dict[str, Any]:
    """Medians over blocks of (hpcdp, bare, bare with hpcdp's kernel) step ms; each
    overhead is the median of the per-block differences."""
    if not rows:
        raise ValueError("no timed blocks")
    bare_ms = statistics.median(r[1] for r in rows)
    same_ms = statistics.median(r[2] for r in rows)
    overhead = statistics.median(r[0] - r[1] for r in rows)
    own = statistics.median(r[0] - r[2] for r in rows)
    return {"label": label, "blocks": len(rows),
            "hpcdp_step_ms": statistics.median(r[0] for r in rows), "bare_step_ms": bare_ms,
            "overhead_ms": overhead, "overhead_share": overhead / bare_ms,
            "bare_same_kernel_step_ms": same_ms, "own_overhead_ms": own,
            "own_overhead_share": own / same_ms,
            "last_window": {k: split.get(k, 0.0) for k in ("data_ms", "compute_ms", "comm_ms")}}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    print(json.dumps(measure(args)), flush=True)
    sys.stdout.flush()
    import os

    os._exit(0)  # parallel HDF5 and Horovod teardown at exit: see dist.shutdown_and_exit


if __name__ == "__main__":
    sys.exit(main())
