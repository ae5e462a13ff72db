"""What averaging the BatchNorm statistics over ranks costs a training step.

    mpirun -np 2 python -m hpcdp.bench.norm_stats [--blocks 10 --steps 10] overrides...

Every rank builds the run the way `hpcdp train` does (hpcdp.train.setup.build)
and times blocks of `train_step` with the per-step average of the running
statistics (hpcdp.train.norm_stats) on and off in turn, on the same model and
data, each side first in every other block: both sides share whatever load the
machine has, block by block, so the median of the per-block ratios is the cost
even where step times move a lot. Then the average alone, many times: its
median is what it can add to a step at most. Rank 0 prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import torch

from hpcdp import config as cfgmod
from hpcdp import tasks
from hpcdp.runtime import dist
from hpcdp.train import setup
from hpcdp.train.evaluate import MetricSums
from hpcdp.train.step import train_step


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m hpcdp.bench.norm_stats",
                                description=__doc__.splitlines()[0])
    p.add_argument("--config", help="TOML config file, as for `hpcdp train`")
    p.add_argument("--blocks", type=int, default=10, help="blocks per side, alternating")
    p.add_argument("--steps", type=int, default=10, help="steps per block")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps of each side first")
    p.add_argument("overrides", nargs="*", metavar="section.key=value")
    args = p.parse_intermixed_args(argv)
    if min(args.blocks, args.steps) < 1 or args.warmup < 0:
        p.error("--blocks and --steps must be positive, --warmup >= 0")
    return args


def batches(run: Any) -> Iterator[Any]:
    """The reader's batches without end: each epoch after the last."""
    epoch = 0
    while True:
        run.train_reader.set_epoch(epoch)
        yield from run.train_reader
        epoch += 1


def summarize(rows: list[tuple[float, float]]) -> dict[str, Any]:
    """Medians over blocks of (on, off) step ms, and of the per-block ratio on/off (pure)."""
    if not rows:
        raise ValueError("no timed blocks")
    return {"blocks": len(rows), "on_step_ms": statistics.median(r[0] for r in rows),
            "off_step_ms": statistics.median(r[1] for r in rows),
            "ratio": statistics.median(r[0] / r[1] for r in rows),
            "ratios": [round(r[0] / r[1], 4) for r in rows]}


def alone(stats: Any, n: int) -> float:
    """Median ms of the average by itself (copy out, all-reduce, copy back), without a
    step to overlap: what it adds to a step at most, apart from the machine's noise."""
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        stats.start()()
        times.append(1000 * (time.perf_counter() - t0))
    return statistics.median(times)


def measure(args: argparse.Namespace, run_dir: str) -> dict[str, Any] | None:
    cfg = cfgmod.build(args.config, [f"run.dir={run_dir}", "log.tensorboard=false",
                                     "log.progress=false", *args.overrides], tasks.defaults)
    task = tasks.get(cfg.task.name)
    dist.init(cfg.horovod, cfg.run_dir)
    run = setup.build(cfg, task, dist.rank(), dist.size(), torch.device("cpu"))
    dist.broadcast_start(run.model, run.optimizers)                 # collective: parameters
    stats = run.norm_stats
    if stats is None:
        raise SystemExit("no BatchNorm statistics to average: a BatchNorm model on 2+ ranks")
    run.model.train()
    feed, sums, step = batches(run), MetricSums(task.metrics, run.device, training=True), 0

    def block(on: bool, n: int) -> float:
        nonlocal step
        run.norm_stats = stats if on else None
        t0 = time.perf_counter()
        for _ in range(n):
            train_step(run, feed, run.schedule.lr(0), sums, step)
            step += 1
        return 1000 * (time.perf_counter() - t0) / n

    block(True, args.warmup)
    block(False, args.warmup)
    rows = []
    for b in range(args.blocks):  # each side goes first in turn
        first = b % 2 == 0
        t_first = block(first, args.steps)
        t_second = block(not first, args.steps)
        rows.append((t_first, t_second) if first else (t_second, t_first))
    result = {"model": cfg.model.name, "ranks": run.size, "stats_bytes": stats.nbytes,
              "steps_per_block": args.steps, **summarize(rows),
              "average_alone_ms": alone(stats, args.blocks * args.steps)}
    return result if run.root else None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="hpcdp-norm-stats-") as tmp:
        result = measure(args, tmp)
    if result is not None:
        print(json.dumps(result), flush=True)
    dist.shutdown_and_exit(0)  # parallel HDF5 and Horovod teardown: see its docstring
    return 0


if __name__ == "__main__":
    sys.exit(main())
