"""`hpcdp bench user-task`: what naming a task by reference costs per training step.

The same training (the digits CNN on the digits, `hpcdp/configs/digits.toml`) runs
under `task.name=image` and under a user's task file that wraps the built-in network
(`USER_TASK`: `image.TASK` with its own `build_model`, built with `dataclasses.replace`),
named `task.name=<file>:TASK`. The two alternate, the order swapped each round, so that
load from elsewhere on a shared machine falls on both alike; each run's steady-state
step time comes from its metrics.jsonl (hpcdp.bench.train.run_training), and the median
over rounds of each and their ratio are printed.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hpcdp import cliargs
from hpcdp.bench import USER_TASK_RATIO as TARGET_RATIO
from hpcdp.bench import common
from hpcdp.bench.train import in_scratch, run_training, write_results
from hpcdp.bench.train_setups import CONFIGS, Setup, prepare_data

#: The user's task file: the image task with a builder of its own around the built-in network.
USER_TASK = '''\
"""A user's task that wraps the image task's own network."""
from dataclasses import replace

from hpcdp.tasks import image


def build_model(cfg, sample_shape):
    return image.TASK.build_model(cfg, sample_shape)


TASK = replace(image.TASK, name="my_image", build_model=build_model)
'''
SIDES = ("built-in", "user task")


def compare(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Median step time of each side over its runs, and the user task's over the built-in's."""
    medians = {}
    for side in SIDES:
        times = [r["step_ms"] for r in runs if r["side"] == side]
        if not times:
            raise ValueError(f"no {side} run to compare")
        medians[side] = common.median(times)
    ratio = medians["user task"] / medians["built-in"]
    return {"step_ms": medians, "ratio": ratio, "rounds": len(runs) // 2,
            "within_target": ratio <= TARGET_RATIO}


def table(summary: Mapping[str, Any]) -> str:
    """The two medians and the ratio as one small table."""
    ms = summary["step_ms"]
    rows = [[side, f"{ms[side]:.3f}"] for side in SIDES]
    rows.append(["user task / built-in", f"{summary['ratio']:.3f}"])
    return common.format_table(["task.name", "median step ms"], rows)


def setup_for(side: str, task_file: Path, args: argparse.Namespace) -> Setup:
    """The digits CNN's setup under the built-in task or the user's task file."""
    task = "image" if side == "built-in" else f"{task_file}:TASK"
    return Setup(side, "digits_cnn", "digits_cnn", CONFIGS / "digits.toml",
                 (f"task.name={task}",), batch=args.batch)


def run_rounds(work: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every round both sides on `args.np` ranks, the order swapped each round."""
    task_file = work / "own" / "mytask.py"
    task_file.parent.mkdir(parents=True)
    task_file.write_text(USER_TASK)
    data = prepare_data(work / "data", [setup_for(SIDES[0], task_file, args)], args)
    runs = []
    for rnd in range(args.rounds):
        for side in SIDES if rnd % 2 == 0 else SIDES[::-1]:
            s = setup_for(side, task_file, args)
            run_dir = work / f"{side.replace(' ', '-')}-r{rnd}"
            figures = run_training(s, data[s.data], args.np, run_dir, args)
            runs.append({"side": side, "round": rnd, **figures})
            print(f"round {rnd} {side}: {figures['step_ms']:.3f} ms/step", flush=True)
    return runs


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="hpcdp bench user-task",
                                description=__doc__.splitlines()[0])
    p.add_argument("--np", type=int, default=2, help="ranks per run")
    p.add_argument("--rounds", type=int, default=4, help="rounds of the two runs (median)")
    p.add_argument("--steps", type=int, default=200, help="timed steps per run")
    p.add_argument("--warmup", type=int, default=50, help="steps left out at the start")
    p.add_argument("--window", type=int, default=50, help="steps per metrics window")
    p.add_argument("--batch", type=int, default=32, help="per rank")
    p.add_argument("--set", action="append", default=[], metavar="section.key=value",
                   help="extra `hpcdp train` override for every run")
    p.add_argument("--timeout", type=float, default=300.0, help="bound per launch, seconds")
    p.add_argument("--out", default="bench/results", help="folder for the JSON")
    p.add_argument("--name", default="user-task", help="file stem of the JSON")
    p.add_argument("--check", action="store_true", help="exit 1 when the ratio is over 1.02")
    args = cliargs.parse_args(p, argv)
    if min(args.np, args.rounds, args.steps, args.window, args.batch) < 1 or args.warmup < 0:
        p.error("--np, --rounds, --steps, --window and --batch must be positive, --warmup >= 0")
    if args.warmup % args.window or args.steps % args.window:
        p.error(f"--window {args.window} must divide --warmup {args.warmup} "
                f"and --steps {args.steps}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    runs = in_scratch("hpcdp-bench-user-task-", lambda work: run_rounds(work, args))
    if runs is None:
        return 1
    summary = compare(runs)
    print(f"\ndigits CNN on {args.np} rank(s), batch {args.batch} per rank, {args.steps} steps "
          f"after {args.warmup} warm-up, median of {args.rounds} alternating round(s)")
    print(table(summary))
    verdict = {f"user task within {TARGET_RATIO - 1:.0%} of the built-in step":
               summary["within_target"]}
    for name, ok in verdict.items():
        print(f"  {'met ' if ok else 'MISSED'}  {name}")
    write_results(args, "user-task", {"ratio": TARGET_RATIO}, runs=runs,
                  summary={**summary, "checks": verdict})
    return 1 if args.check and not summary["within_target"] else 0
