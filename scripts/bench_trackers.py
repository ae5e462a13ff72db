"""What a tracker costs training, side by side: the digits demo on 2 ranks with no tracker,
MLflow's local store, and an MLflow server that refuses or never answers.

    python scripts/bench_trackers.py [--repeats 3] [--epochs 3]

The four settings run in turn, `--repeats` rounds, so that each sees the machine's
changing load alike. Each run's training rate (summary.json's samples_per_s) and the
job's wall time (launch to exit, the trackers' bounded close included) are printed as
medians, each as a ratio to no tracker, with the warnings each run printed; beside the
rate, the range of each run's ratio (no tracker's own range is the noise).
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hpcdp.runtime.launcher import run_ranks

REPO = Path(__file__).resolve().parent.parent
TRAIN = [sys.executable, "-m", "hpcdp.train", "--config", str(REPO / "hpcdp/configs/digits.toml")]


def closed_port() -> int:
    """A loopback port nothing listens on (bound for a moment, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def settings(silent_port: int) -> dict[str, list[str]]:
    """Each setting's overrides (the silent server's socket listens and never reads)."""
    return {
        "off": [],
        "mlflow, local store": ['run.trackers=["mlflow"]'],
        "mlflow, refusing server": ['run.trackers=["mlflow"]',
                                    f"run.mlflow_uri=http://127.0.0.1:{closed_port()}"],
        "mlflow, silent server": ['run.trackers=["mlflow"]',
                                  f"run.mlflow_uri=http://127.0.0.1:{silent_port}"],
    }


def prepare(data: Path) -> None:
    subprocess.run(["mpirun", "-np", "2", sys.executable, str(REPO / "datasets/digits.py"),
                    "--out", str(data)], check=True, capture_output=True)


def one_run(data: Path, run: Path, overrides: list[str], epochs: int) -> dict[str, object]:
    start = time.perf_counter()
    done = run_ranks([*TRAIN, f"data.path={data}", f"run.dir={run}", f"run.epochs={epochs}",
                      "log.progress=false", "log.tensorboard=false", *overrides],
                     np=2, timeout=600.0, env={"MLFLOW_TRACKING_URI": ""})
    wall = time.perf_counter() - start
    if not done.ok:
        raise SystemExit(done.describe())
    summary = json.loads((run / "summary.json").read_text())
    warnings = sum("WARNING" in line for line in done.output.splitlines())
    return {"rate": float(summary["samples_per_s"]), "wall": wall, "warnings": warnings}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)
        root = Path(tmp)
        prepare(root / "data")
        results: dict[str, list[dict[str, object]]] = {}
        for round_ in range(args.repeats):
            for index, (name, overrides) in enumerate(settings(silent.getsockname()[1]).items()):
                run = root / f"run-{round_}-{index}"  # a fresh folder: never a resume
                results.setdefault(name, []).append(
                    one_run(root / "data", run, overrides, args.epochs))
    base_rate = statistics.median(r["rate"] for r in results["off"])
    base_wall = statistics.median(r["wall"] for r in results["off"])
    print(f"digits, 2 ranks, {args.epochs} epochs, median of {args.repeats} interleaved runs")
    print(f"{'setting':<26}{'samples/s':>10}{'ratio':>7}{'runs (ratios)':>16}{'wall s':>8}"
          f"{'ratio':>7}  warnings")
    for name, runs in results.items():
        rate = statistics.median(r["rate"] for r in runs)
        wall = statistics.median(r["wall"] for r in runs)
        spread = [r["rate"] / base_rate for r in runs]  # the noise: no tracker's own spread
        warned = sorted({r["warnings"] for r in runs})
        print(f"{name:<26}{rate:>10.0f}{rate / base_rate:>7.2f}"
              f"{f'{min(spread):.2f}-{max(spread):.2f}':>16}{wall:>8.1f}"
              f"{wall / base_wall:>7.2f}  {warned}")


if __name__ == "__main__":
    main()
