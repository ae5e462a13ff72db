"""`hpcdp bench prep --criteo`: the Criteo recipe's peak memory per rank at 1x and 8x the rows.

Generates Criteo-format logs with Terabyte-like cardinalities
(`hpcdp.data.synth.criteo_logs.ScaleSpec`) of ``--rows`` and of
``--scale`` times as many training rows, then prepares each with ``--buckets``
and with ``--min-count`` on ``--np`` ranks under mpirun, every rank reporting
its peak resident memory (``ru_maxrss``). The target: the peak of the larger
input at most 1.25x that of the smaller, for both id rules. With
``--min-count`` each rank also holds its share of the distinct values, which
grows with the rows (about 5 bytes a distinct value over the ranks), so that
ratio depends on the vocabulary as well as on the streaming. The logs are
generated in a temporary folder (``--tmp``) and removed at the end: about 260
bytes a row.
"""

from __future__ import annotations

import argparse
import re
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from hpcdp.bench import common
from hpcdp.bench.reader import result_path
from hpcdp.cliargs import parse_args
from hpcdp.runtime.launcher import run_ranks

TARGET_RATIO = 1.25
VAL_ROWS = 10_000


def rank_main(argv: list[str]) -> int:
    """One rank: the recipe, then ``maxrss_kib N`` (this process's peak)."""
    from hpcdp.data.prep.clicks.criteo_recipe import main

    status = main(argv)
    print(f"maxrss_kib {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}", flush=True)
    return status


def generate(folder: Path, rows: int, seed: int) -> dict[str, Any]:
    from hpcdp.data.synth import criteo_logs as cs

    folder.mkdir(parents=True)
    spec = cs.ScaleSpec(seed=seed)
    start = time.perf_counter()
    nbytes = cs.write_scale(spec, "train", rows, [str(folder / "day_0.txt")])
    cs.write_scale(spec, "val", VAL_ROWS, [str(folder / "val.txt")])
    return {"rows": rows, "bytes": nbytes, "generate_seconds": time.perf_counter() - start}


def prepare(folder: Path, rule: list[str], args: argparse.Namespace) -> dict[str, Any]:
    out = folder / "out"
    argv = [sys.executable, "-m", "hpcdp.bench.prep_criteo", "--rank-run", "--files",
            str(folder / "day_0.txt"), "--val-files", str(folder / "val.txt"), "--out",
            str(out), "--block-mib", str(args.block_mib), *rule]
    run = run_ranks(argv, np=args.np, timeout=args.timeout)
    shutil.rmtree(out, ignore_errors=True)
    if not run.ok:
        raise RuntimeError(run.describe()[-4000:])
    peaks = [int(k) / 1024 for k in re.findall(r"maxrss_kib (\d+)", run.output)]
    seconds = re.search(r"([0-9.]+) s on \d+ rank", run.output)
    return {"peak_mib_per_rank": peaks, "seconds": float(seconds.group(1)) if seconds else None,
            "wall_seconds": run.seconds}


def summarize(results: list[dict[str, Any]], small: int, big: int) -> dict[str, Any]:
    """Per rule: the largest rank's peak at each size and their ratio; the checks."""
    out: dict[str, Any] = {"checks": {}}
    for rule in sorted({r["rule"] for r in results}):
        peak = {r["rows"]: max(r["peak_mib_per_rank"]) for r in results if r["rule"] == rule}
        ratio = peak[big] / peak[small]
        out[rule] = {"peak_mib": {str(k): v for k, v in peak.items()}, "ratio": ratio}
        out["checks"][f"{rule}: peak at {big} rows <= {TARGET_RATIO}x at {small}"] = (
            ratio <= TARGET_RATIO)
    return out


def main(argv: list[str] | None = None) -> int:
    raw = list(sys.argv[1:] if argv is None else argv)
    if raw[:1] == ["--rank-run"]:
        return rank_main(raw[1:])
    p = argparse.ArgumentParser(prog="hpcdp bench prep --criteo", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--scale", type=int, default=8)
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--block-mib", type=float, default=64.0)
    p.add_argument("--buckets", type=int, default=10_000_000)
    p.add_argument("--min-count", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=7200.0, help="bound on each launch, s")
    p.add_argument("--tmp", default=None, help="folder for the generated logs")
    p.add_argument("--out", default="bench/results/prep_criteo.json",
                   help="JSON file, or a folder to write prep_criteo.json into")
    p.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    args = parse_args(p, raw)
    rules = {"buckets": ["--buckets", str(args.buckets)],
             "min-count": ["--min-count", str(args.min_count)]}
    sizes = (args.rows, args.rows * args.scale)
    results, inputs = [], []
    with tempfile.TemporaryDirectory(prefix="hpcdp-bench-criteo-", dir=args.tmp) as tmp:
        for rows in sizes:
            folder = Path(tmp) / f"rows{rows}"
            inputs.append(generate(folder, rows, args.seed))
            print(f"generated {rows} rows ({inputs[-1]['bytes'] / 2**20:.0f} MiB) in "
                  f"{inputs[-1]['generate_seconds']:.1f} s", flush=True)
            for name, rule in rules.items():
                got = {"rows": rows, "rule": name, **prepare(folder, rule, args)}
                results.append(got)
                print(f"{rows} rows, {name}: {got['seconds']} s, peak per rank "
                      f"{', '.join(f'{m:.0f}' for m in got['peak_mib_per_rank'])} MiB",
                      flush=True)
            shutil.rmtree(folder, ignore_errors=True)
    summary = summarize(results, *sizes)
    print()
    print(common.format_table(
        ["rule", *(f"peak MiB at {n} rows" for n in sizes), "ratio"],
        [[rule, *(summary[rule]["peak_mib"][str(n)] for n in sizes), summary[rule]["ratio"]]
         for rule in rules]))
    for name, ok in summary["checks"].items():
        print(f"  [{'ok' if ok else 'MISSED'}] {name}")
    payload = {"benchmark": "prep_criteo",
               "config": {k: v for k, v in vars(args).items() if k != "tmp"},
               "inputs": inputs, "runs": results, "summary": summary}
    print(f"wrote {common.write_json(result_path(args.out, 'prep_criteo'), payload)}")
    return 1 if args.check and not all(summary["checks"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
