"""`hpcdp bench plan`: `hpcdp plan`'s predictions against measured runs, side by side.

For each model (the digits CNN, the tiny GPT, ResNet-18) at a fixed global
batch: the measurement `hpcdp plan` starts from (1 rank, one thread, at the
per-rank batch of the 2-rank run and at half of it), then real runs on 1 rank and on 2 ranks of this
node, and, with --slurm, on two nodes of a Slurm cluster (one rank each, through
`hpcdp slurm submit --nodes 2`). The network is fitted from `hpcdp bench
allreduce` JSON (--allreduce), used for both levels unless --allreduce-inter is
given. The table: predicted and measured step time and the error, predicted
once from one rank alone and once from a busy node: two independent 1-rank runs
at once, which see the contention for cores and memory that the model leaves out
(on this machine the two "nodes" of the local cluster share the same cores).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from hpcdp import cliargs
from hpcdp.bench import common
from hpcdp.bench.train_setups import prepare_data, setups, train_overrides
from hpcdp.plan import model, network
from hpcdp.plan.cli import check_rows
from hpcdp.plan.measure import Measured, read_run, step_of

MODELS = ("digits_cnn", "gpt", "resnet18")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="hpcdp bench plan", description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--allreduce", type=Path, required=True,
                   help="hpcdp bench allreduce JSON from this node (2 ranks)")
    p.add_argument("--allreduce-inter", type=Path, help="... with one rank on each of 2 nodes")
    p.add_argument("--global-batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--rounds", type=int, default=1,
                   help="repeat every run this often, in rotated order; medians are compared")
    p.add_argument("--slurm", action="store_true",
                   help="also run on 2 nodes of the Slurm cluster SLURM_CONF names")
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--out", default="bench/results")
    p.add_argument("--name", default="plan")
    args = cliargs.parse_args(p, argv)
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    bad = [m for m in args.models if m not in MODELS]
    if bad:
        p.error(f"--models: choose from {', '.join(MODELS)}, got {bad}")
    # What train_setups expects of `hpcdp bench train`'s arguments.
    args.window, args.width, args.cifar_stem, args.samples = 5, 32, False, 4096
    args.seq_len, args.batch, args.tables = 64, None, ()
    return args


def local_run(argv: list[str], np: int, timeout: float) -> None:
    from hpcdp.runtime.launcher import run_ranks

    env = {"PYTHONPATH": common.pythonpath(), "OMP_NUM_THREADS": "1"}
    run = run_ranks([sys.executable, "-m", "hpcdp.train", *argv], np=np, launcher="mpirun",
                    timeout=timeout, env=env)
    if not run.ok:
        raise common.BenchError(f"{np}-rank run failed:\n{run.describe()[-4000:]}")


def pair_run(argvs: list[list[str]], timeout: float) -> None:
    """Independent 1-rank runs at once (no communication): each rank's step while the
    node's other ranks compute too, which a rank alone does not see."""
    from hpcdp.bench.processes import run_together

    env = {**common.pythonpath_env(), "OMP_NUM_THREADS": "1"}
    done = run_together([[sys.executable, "-m", "hpcdp.train", *a] for a in argvs],
                        [env] * len(argvs), timeout)
    if not done.ok:
        raise common.BenchError(f"runs side by side failed:\n{done.output[-4000:]}")


def slurm_run(argv: list[str], where: Path, timeout: float) -> None:
    """`hpcdp slurm submit --nodes 2` (one rank per node), waited for (bounded)."""
    config = argv[argv.index("--config") + 1] if "--config" in argv else None
    rest = [a for a in argv if a not in ("--config", config)]
    cmd = [sys.executable, "-m", "hpcdp", "slurm", "submit", "--site", "none", "--nodes", "2",
           "--cpus-per-task", "1", "--time", "15", "--signal-lead", "60",
           "--output", str(where / "job-%j.out"), *(["--config", config] if config else []),
           *rest]
    env = {**common.pythonpath_env(), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env,
                          cwd=where, check=False)
    if done.returncode:
        raise common.BenchError(f"submit failed: {done.stderr}")
    job = done.stdout.strip()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        shown = subprocess.run(["scontrol", "show", "job", "-o", job], capture_output=True,
                               text=True, timeout=30, check=False).stdout
        if "JobState=COMPLETED" in shown:
            return
        if any(f"JobState={s}" in shown for s in ("FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL")):
            raise common.BenchError(f"job {job} did not complete: {shown}")
        time.sleep(1)
    subprocess.run(["scancel", job], timeout=30, check=False)
    raise common.BenchError(f"job {job} still running after {timeout:.0f}s: cancelled")


def one_round(s: Any, data: Path, root: Path, args: argparse.Namespace,
              shift: int) -> dict[str, Measured]:
    """Every run of one model once, in an order rotated by `shift` (load from elsewhere on a
    shared machine then falls on each alike over the rounds): key -> its steady state."""
    g = args.global_batch
    # The measurement: 1 rank at the 2-rank run's per-rank batch, and at half of it.
    local = {"ref": (1, g // 2), "half": (1, g // 4), "one": (1, g), "two": (2, g)}
    keys = [*local, "busy", *(["slurm"] if args.slurm else [])]
    keys = keys[shift % len(keys):] + keys[:shift % len(keys)]
    found: dict[str, Measured] = {}

    def overrides(run_dir: Path, batch: int, where: Path = data) -> list[str]:
        a = argparse.Namespace(**{**vars(args), "set": [f"data.global_batch_size={batch}"]})
        return train_overrides(s, where, run_dir, a)

    for key in keys:
        run_dir = (root / key).resolve()
        if key in local:
            np, batch = local[key]
            print(f"[{s.label}] {key}: {np} rank(s), global batch {batch}", flush=True)
            local_run(overrides(run_dir, batch), np, args.timeout)
        elif key == "busy":
            pair = [root / f"busy{i}" for i in range(2)]
            print(f"[{s.label}] busy: 2 independent 1-rank runs at once, batch {g // 2}",
                  flush=True)
            pair_run([overrides(d, g // 2) for d in pair], args.timeout)
            # The step ends with the slower rank: the slower of the two runs.
            found[key] = max((read_run(d, args.warmup) for d in pair), key=lambda m: m.step_ms)
            continue
        else:
            print(f"[{s.label}] slurm: 2 nodes x 1 rank, global batch {g}", flush=True)
            run_dir.parent.mkdir(parents=True, exist_ok=True)
            slurm_run(overrides(run_dir, g, data.resolve()), run_dir.parent, args.timeout)
        found[key] = read_run(run_dir, args.warmup)
    return found


def median_run(runs: list[Measured]) -> Measured:
    """The run with the median step time (the lower middle of an even count)."""
    ordered = sorted(runs, key=lambda m: m.step_ms)
    return ordered[(len(ordered) - 1) // 2]


def model_rows(label: str, found: dict[str, Measured], net: model.Network,
               slurm: bool) -> list[list[Any]]:
    """check_rows from one rank alone, beside the prediction from the busy node."""
    ref = found["ref"]
    against = [(found["one"], 1), (found["two"], 1), *([(found["slurm"], 2)] if slurm else [])]
    step = step_of(ref, 2 / 3, True, half=found["half"])
    rows = check_rows(label, step, net, against, ref)
    # The multi-rank runs again, predicted from the busy node's step (same batch per rank).
    busy_step = step_of(found["busy"], 2 / 3, True)
    rows[0][7:7] = ["-", "-"]
    for row, (m, nodes) in zip(rows[1:], against):
        if m.ranks == 1:
            row[7:7] = ["-", "-"]
            continue
        total = model.step_at(busy_step, net, nodes, m.ranks // nodes, m.global_batch)[0]
        row[7:7] = [f"{total * 1e3:.2f}", f"{total * 1e3 / m.step_ms - 1:+.0%}"]
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    work = out / f"{args.name}-runs"
    work.mkdir(parents=True, exist_ok=True)
    fit = network.fit_allreduce(json.loads(args.allreduce.read_text()), where=str(args.allreduce))
    inter = (network.fit_allreduce(json.loads(args.allreduce_inter.read_text()))
             if args.allreduce_inter else fit).link
    net = model.Network(fit.link, inter)
    chosen = setups(args.models, args)
    data = prepare_data(work / "data", chosen, args)
    rows: list[list[Any]] = []
    for s in chosen:
        rounds = [one_round(s, data[s.data], work / s.label / f"round{r}", args, r)
                  for r in range(args.rounds)]
        found = {key: median_run([r[key] for r in rounds]) for key in rounds[0]}
        print(f"[{s.label}] 1-rank step at {args.global_batch // 2} per round: "
              f"{[round(r['ref'].step_ms, 1) for r in rounds]} ms alone, "
              f"{[round(r['busy'].step_ms, 1) for r in rounds]} ms on a busy node", flush=True)
        rows += model_rows(s.label, found, net, args.slurm)
    headers = ["model", "ranks", "nodes", "global batch", "predicted ms", "measured ms",
               "error", "predicted ms (busy node)", "error (busy node)", "measured"]
    print(common.format_table(headers, rows))
    print(f"medians over {args.rounds} round(s); network: alpha {fit.link.alpha_s * 1e6:.1f} us, "
          f"{fit.link.gbytes_per_s:.2f} GB/s within the node (from {args.allreduce}); across: "
          f"alpha {inter.alpha_s * 1e6:.1f} us, {inter.gbytes_per_s:.2f} GB/s")
    path = common.write_json(out / f"{args.name}.json", {
        "benchmark": "plan", "headers": headers, "rows": rows,
        "network": {"intra": vars(fit.link), "inter": vars(inter)},
        "params": {"global_batch": args.global_batch, "steps": args.steps,
                   "warmup": args.warmup, "rounds": args.rounds}})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
