"""`hpcdp bench <what>`: each benchmark is a module here with `main(argv) -> int`.

`hpcdp bench all --out DIR` runs every one in turn with its default sizes, each
writing its JSON (and PNG) into DIR, then prints one table of the targets.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hpcdp.bench.common import format_table
from hpcdp.cliargs import parse_args

BENCHMARKS: dict[str, str] = {
    "allreduce": "all-reduce bandwidth: Horovod (MPI, Gloo) vs raw mpi4py vs memcpy",
    "fusion": "tensor fusion on/off for many small asynchronous all-reduces",
    "reader": "sharded HDF5 reader vs raw slab reads vs a per-sample DataLoader",
    "prep": "parallel dataset preparation, 1 rank vs 2 ranks",
    "train": "weak scaling of real training, 1 vs 2 ranks, step-time split (or --mode ceiling)",
    "user-task": "a user's task file wrapping a built-in network vs task.name=image",
    "gpu": "one GPU: ResNet-50, GPT-2 124M, DLRM, eager and compiled (--tiny: CPU check)",
    "large-batch": "the result at 8x and 32x the batch (SGD/AdamW vs LARS/LAMB), compression",
}
#: Benchmarks that need a GPU: left out of `all` unless named in --only.
GPU_ONLY = ("gpu",)
#: Benchmarks of a quarter of an hour and more: left out of `all` unless named in --only.
LONG = ("large-batch",)
#: Each plain launcher's samples/s over the ceiling's (hpcdp.bench.ceiling; here so that
#: this module imports nothing heavy).
TARGET_VS_CEILING = {"resnet18": 0.95, "digits_cnn": 0.8}
#: The data share of the step time to stay under, where a model's target is not 5%.
DATA_SHARE_OF = {"gpt2_124m": 0.02}
#: A user's task wrapping a built-in network: its step time over the built-in task's at most.
USER_TASK_RATIO = 1.02
ALLREDUCE_TARGET = 0.8  # Horovod's bus bandwidth over raw MPI's at the largest size
#: hpcdp's 1-rank step over the bare loop's, measured in one process: at most this share
#: of the bare step (ResNet-18), or these milliseconds (the digits CNN, whose
#: millisecond steps are mostly fixed costs, so a share would measure noise).
OVERHEAD_SHARE_OF = {"resnet18": 0.02}
OVERHEAD_MS_OF = {"digits_cnn": 0.46}


def targets(name: str, result: Mapping[str, Any]) -> list[tuple[str, str, bool]]:
    """(target, measured, met) rows from one benchmark's JSON; pure, for the summary table."""
    summary = result.get("summary") or {}
    rows: list[tuple[str, str, bool]] = []
    if name == "train":
        for model, s in summary.items():
            if model == "checks":
                continue
            if "launchers" in s:  # --mode ceiling
                target = TARGET_VS_CEILING.get(model)
                rows += [(f"{model}: plain {name} >= {target:.2f}x ceiling",
                          f"{run['vs_ceiling']:.2f}x", run["vs_ceiling"] >= target)
                         for name, run in s["launchers"].items() if target is not None]
                continue
            share = DATA_SHARE_OF.get(model, 0.05)
            rows.append((f"{model}: data share < {share:.0%}", f"{s['shares']['data']:.1%}",
                         s["shares"]["data"] < share))
            if s.get("vs_ddp") is not None:
                rows.append((f"{model}: hpcdp/DDP >= 1", f"{s['vs_ddp']:.2f}",
                             s["vs_ddp"] >= 1.0))
            inproc = s.get("in_process")
            if inproc is not None:  # measured inside one process: it decides
                rows += overhead_rows(model, inproc)
            elif s.get("vs_bare_1") is not None:
                rows.append((f"{model}: 1 rank/bare loop >= 0.98", f"{s['vs_bare_1']:.3f}",
                             s["vs_bare_1"] >= 0.98))
        return rows
    if name == "allreduce":
        hvd = [r for r in result.get("rows", []) if r.get("vs_mpi") is not None]
        if hvd:
            top = max(r["bytes"] for r in hvd)
            for r in (r for r in hvd if r["bytes"] == top):
                rows.append((f"{r['config']}/{r['column']} >= {ALLREDUCE_TARGET:.0%} of raw MPI "
                             f"({top} B)", f"{r['vs_mpi']:.0%}", r["vs_mpi"] >= ALLREDUCE_TARGET))
        return rows
    if name == "fusion":
        launcher = (result.get("params") or {}).get("launcher", "mpirun")
        for gain, run in ((result.get("speedup"), launcher),
                          (result.get("speedup_other"), result.get("other_launcher"))):
            if gain is not None:
                rows.append((f"fusion on >= 2x faster than off ({run})", f"{gain:.2f}x",
                             gain >= 2.0))
        for run, gain in (result.get("speedup_buckets") or {}).items():
            rows.append((f"hpcdp gradient buckets >= 2x faster than off ({run})",
                         f"{gain:.2f}x", gain >= 2.0))
        return rows
    if name == "user-task" and "ratio" in summary:
        return [(f"user task's step / the built-in's <= {USER_TASK_RATIO}",
                 f"{summary['ratio']:.3f}", summary["ratio"] <= USER_TASK_RATIO)]
    if name == "prep" and "speedup_2_over_1" in summary:
        return [("prep: 2 ranks not slower than 1", f"{summary['speedup_2_over_1']:.2f}x",
                 summary["speedup_2_over_1"] >= 1.0)]
    return [(check, "-", bool(ok)) for check, ok in (summary.get("checks") or {}).items()]


def overhead_rows(model: str, inproc: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """The in-process overhead against its target for `model`, where it has one."""
    if model in OVERHEAD_SHARE_OF:
        share = OVERHEAD_SHARE_OF[model]
        return [(f"{model}: 1-rank step within {share:.0%} of the bare loop's (one process)",
                 f"{inproc['overhead_share']:+.1%}", inproc["overhead_share"] <= share)]
    if model in OVERHEAD_MS_OF:
        ms = OVERHEAD_MS_OF[model]
        return [(f"{model}: 1-rank step at most {ms} ms over the bare loop's (one process)",
                 f"{inproc['overhead_ms']:+.3f} ms", inproc["overhead_ms"] <= ms)]
    return []


def module_of(name: str) -> str:
    """The module of benchmark `name` (a dash in the command is an underscore in Python)."""
    return f"hpcdp.bench.{name.replace('-', '_')}"


def run_all(argv: list[str]) -> int:
    """Every benchmark in turn into one folder, then the table of targets."""
    p = argparse.ArgumentParser(prog="hpcdp bench all")
    p.add_argument("--out", default="bench/results", help="folder for every JSON and PNG")
    p.add_argument("--only", default=",".join(n for n in BENCHMARKS
                                              if n not in (*GPU_ONLY, *LONG)),
                   help="comma list of benchmarks")
    args = parse_args(p, argv)
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        p.error(f"--only: unknown {unknown}; choose from {', '.join(BENCHMARKS)}")
    out = Path(args.out)
    rows: list[list[Any]] = []
    failed = []
    for name in names:
        print(f"\n=== hpcdp bench {name} ===", flush=True)
        start = time.monotonic()
        code = int(importlib.import_module(module_of(name)).main(["--out", str(out)]) or 0)
        print(f"=== {name}: exit {code} after {time.monotonic() - start:.0f}s ===", flush=True)
        path = out / f"{name}.json"
        if code or not path.exists():
            failed.append(name)
            rows.append([name, "benchmark failed", "-", "no"])
            continue
        for target, measured, ok in targets(name, json.loads(path.read_text())):
            rows.append([name, target, measured, "yes" if ok else "NO"])
    print("\nTargets (each benchmark's figures are in its JSON and PNG under "
          f"{out}):\n" + format_table(["benchmark", "target", "measured", "met"], rows))
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print("usage: hpcdp bench <what> [options]\n\nbenchmarks:")
        for name, help_ in BENCHMARKS.items():
            print(f"  {name:<12} {help_}")
        print(f"  {'all':<12} every benchmark in turn into --out DIR, then a table of targets")
        return 0
    name = args[0]
    if name == "all":
        return run_all(args[1:])
    if name not in BENCHMARKS:
        print(
            f"hpcdp bench: unknown benchmark {name!r}; choose from {', '.join(BENCHMARKS)}, all",
            file=sys.stderr,
        )
        return 2
    module = importlib.import_module(module_of(name))
    return int(module.main(args[1:]) or 0)
