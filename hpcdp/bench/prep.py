"""`hpcdp bench prep`: parallel dataset preparation, 1 rank vs 2 ranks, same data.

Runs `hpcdp prep synthetic` under mpirun (via `hpcdp.runtime.launcher.run_ranks`) with
1 and then 2 ranks, alternating, for a few rounds. The figure compared is the
preparation's own time (from the first barrier to the renamed file, reported
by rank 0); the wall time with the launcher's start-up is shown beside it.

``--criteo``: peak memory per rank of the Criteo recipe at 1x and 8x generated rows
(`hpcdp.bench.prep_criteo`; its own options follow).
``--memory``: peak memory per rank of the text and image recipes at a small and a
large generated input (`hpcdp.bench.prep_memory`; its own options follow).
``--rates``: rows (tokens, images) and MB per second per core of every recipe on 1 and 2
ranks, with the Criteo Terabyte projection (`hpcdp.bench.prep_rates`; its own options).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from hpcdp.bench import common, prep_criteo, prep_memory, prep_rates
from hpcdp.bench.reader import result_path
from hpcdp.cliargs import parse_args
from hpcdp.runtime.launcher import run_ranks

MIB = 2**20


def summarize(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians per rank count, the speed-up of 2 ranks over 1, and the verdict."""
    med = {
        str(n): {
            "seconds": common.median(r["seconds"] for r in rounds if r["ranks"] == n),
            "wall_seconds": common.median(r["wall_seconds"] for r in rounds if r["ranks"] == n),
        }
        for n in (1, 2)
    }
    speedup = med["1"]["seconds"] / med["2"]["seconds"]
    return {"median": med, "speedup_2_over_1": speedup,
            "checks": {"2 ranks not slower than 1": speedup >= 1.0}}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--criteo" in argv:  # the Criteo recipe's memory at 1x and 8x the rows: its own module
        return prep_criteo.main([a for a in argv if a != "--criteo"])
    if "--memory" in argv:  # peak memory per rank at two input sizes: its own module
        return prep_memory.main([a for a in argv if a != "--memory"])
    if "--rates" in argv:  # every recipe's rate per core, and the Terabyte projection
        return prep_rates.main([a for a in argv if a != "--rates"])
    p = argparse.ArgumentParser(prog="hpcdp bench prep", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--samples", type=int, default=100_000)
    p.add_argument("--shape", default="3,32,32")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--timeout", type=float, default=300.0, help="bound on each launch, seconds")
    p.add_argument("--out", default="bench/results/prep.json",
                   help="JSON file, or a folder to write prep.json into")
    p.add_argument("--check", action="store_true", help="exit 1 when 2 ranks are slower")
    p.add_argument("--criteo", action="store_true",
                   help="instead: the Criteo recipe's peak memory per rank at 1x and 8x the "
                        "rows (hpcdp.bench.prep_criteo; its options: --criteo --help)")
    args = parse_args(p, argv)
    rounds: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="hpcdp-bench-prep-") as tmp:
        for i in range(args.rounds):
            for n in (1, 2):
                out = Path(tmp) / f"np{n}"
                report = Path(tmp) / f"report{n}.json"
                argv_ = [sys.executable, "-m", "hpcdp.data.prep.cli", "synthetic", "--samples",
                         str(args.samples), "--shape", args.shape, "--out", str(out),
                         "--report", str(report)]
                run = run_ranks(argv_, np=n, timeout=args.timeout)
                if not run.ok:
                    print(run.describe()[-4000:], file=sys.stderr)
                    return 1
                rep = json.loads(report.read_text())
                rounds.append({"round": i, "ranks": n, "seconds": rep["seconds"],
                               "wall_seconds": run.seconds, "bytes": rep["bytes"]})
                print(f"round {i}: {n} rank(s): {rep['seconds']:.2f} s "
                      f"({rep['bytes'] / MIB / rep['seconds']:.0f} MiB/s), "
                      f"wall {run.seconds:.2f} s", flush=True)
                shutil.rmtree(out, ignore_errors=True)
    summary = summarize(rounds)
    med = summary["median"]
    nbytes = rounds[0]["bytes"]
    print()
    print(common.format_table(
        ["ranks", "prep seconds (median)", "MiB/s", "wall seconds (median)"],
        [[n, med[n]["seconds"], nbytes / MIB / med[n]["seconds"], med[n]["wall_seconds"]]
         for n in ("1", "2")]))
    print(f"\n2 ranks vs 1: {summary['speedup_2_over_1']:.2f}x")
    for name, ok in summary["checks"].items():
        print(f"  [{'ok' if ok else 'MISSED'}] {name}")
    payload = {"benchmark": "prep",
               "config": {"samples": args.samples, "shape": args.shape, "rounds": args.rounds,
                          "bytes": nbytes, "launcher": "mpirun"},
               "rounds": rounds, "summary": summary}
    print(f"wrote {common.write_json(result_path(args.out, 'prep'), payload)}")
    return 1 if args.check and not all(summary["checks"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
