"""`hpcdp bench large-batch`: what a larger global batch and gradient compression cost in
the result, on two workloads that learn, with the same samples seen.

- `digits`: the digits CNN on the bundled 8x8 digits (validation accuracy), SGD with
  momentum against LARS;
- `gpt`: the tiny GPT on the Markov corpus (validation loss, whose floor is the chain's
  entropy rate, stored in the data), AdamW against LAMB.

Each runs at its reference global batch and at 8x and 32x of it for the same number of
epochs (so the same samples, up to the last partial batch of each epoch, which the
reader drops: the table says how many were seen), the baseline optimizer with the
linear and with the sqrt rule from its reference rate, the large-batch optimizer with
its own rule (LARS linear, LAMB sqrt, as their papers scale). Then, at the reference
batch with the baseline optimizer, compression: the bytes one rank hands to the
gradient all-reduces per step (summary.json's figure) and the final metric for each.
Every run is a real `hpcdp train` on --np ranks (2), one after another.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcdp import cliargs
from hpcdp.bench import common

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


@dataclass(frozen=True)
class Workload:
    """One task of the benchmark and how it is trained at its reference batch."""

    name: str
    config: Path
    metric: str  # the summary's val_<metric>
    higher_is_better: bool
    ref_batch: int  # the reference global batch
    lr: float  # the baseline's peak rate at ref_batch
    epochs: int
    baseline: str  # optim.name
    large: str  # the large-batch optimizer
    large_lr: float  # its peak rate at ref_batch
    large_rule: str  # how its rate follows the batch
    prep: tuple[str, ...]  # the data recipe: `python -m` arguments, then --out DIR


WORKLOADS: dict[str, Workload] = {
    "digits": Workload("digits", CONFIGS / "digits.toml", "acc", True, 8, 0.02, 32, "sgd",
                       "lars", 1.0, "linear", ("hpcdp.data.prep.cli", "digits")),
    "gpt": Workload("gpt", CONFIGS / "lm_markov.toml", "loss", False, 16, 2e-3, 8, "adamw",
                    "lamb", 0.05, "sqrt",
                    ("hpcdp.data.prep.text.markov_recipe", "--docs", "8000", "--val-docs",
                     "500")),
}
#: "none", "bf16", "fp16", or "powersgd:R" (rank R).
DEFAULT_COMPRESSIONS = ("none", "bf16", "powersgd:1", "powersgd:4", "powersgd:16")


@dataclass(frozen=True)
class Case:
    """One training run of the benchmark."""

    workload: str
    mult: int  # the global batch over the reference's
    optimizer: str
    rule: str  # optim.lr_scaling
    compression: str = "none"
    rank: int = 0  # PowerSGD's

    @property
    def label(self) -> str:
        comp = "" if self.compression == "none" else (
            f"-{self.compression}{self.rank or ''}")
        return f"{self.workload}-x{self.mult}-{self.optimizer}-{self.rule}{comp}"

    @property
    def compression_label(self) -> str:
        return f"powersgd rank {self.rank}" if self.compression == "powersgd" else self.compression


def parse_compression(text: str) -> tuple[str, int]:
    """('powersgd', 4) from 'powersgd:4', ('bf16', 0) from 'bf16'; a bad one is named."""
    name, _, rank = text.strip().partition(":")
    if name == "powersgd":
        if not rank.isdigit() or int(rank) < 1:
            raise ValueError(f"compression {text!r}: write powersgd:RANK with RANK >= 1")
        return name, int(rank)
    if rank or name not in ("none", "bf16", "fp16"):
        raise ValueError(f"compression {text!r}: choose none, bf16, fp16 or powersgd:RANK")
    return name, 0


def cases(w: Workload, mults: Sequence[int], compressions: Sequence[str]) -> list[Case]:
    """Every run of one workload: the reference first (the baseline at 1x, uncompressed)."""
    out = [Case(w.name, 1, w.baseline, "linear"), Case(w.name, 1, w.large, w.large_rule)]
    for mult in (m for m in mults if m != 1):
        out += [Case(w.name, mult, w.baseline, "linear"), Case(w.name, mult, w.baseline, "sqrt"),
                Case(w.name, mult, w.large, w.large_rule)]
    for name, rank in map(parse_compression, compressions):
        if name != "none":
            out.append(Case(w.name, 1, w.baseline, "linear", name, rank))
    return out


def case_args(w: Workload, case: Case, data: Path, run_dir: Path) -> list[str]:
    """`hpcdp train` arguments of one case: the workload's config, its batch, optimizer,
    rate and compression, no checkpoints kept, no extra output."""
    lr = w.large_lr if case.optimizer == w.large else w.lr
    argv = ["--config", str(w.config), f"data.path={data}", f"run.dir={run_dir}",
            f"data.global_batch_size={w.ref_batch * case.mult}", f"optim.name={case.optimizer}",
            f"optim.lr={lr}", f"optim.ref_batch={w.ref_batch}", f"optim.lr_scaling={case.rule}",
            f"run.epochs={w.epochs}", "run.max_steps=0", "log.every_steps=50",
            "log.tensorboard=false", "log.progress=false", "checkpoint.resume=none",
            "checkpoint.every_steps=0", "checkpoint.keep=1",
            f"horovod.compression={case.compression}"]
    if case.compression == "powersgd":
        argv.append(f"horovod.powersgd_rank={case.rank}")
    return argv


# --------------------------------------------------------------------------- results (pure)


def result_of(w: Workload, case: Case, summary: Mapping[str, Any] | None,
              seconds: float, failure: str | None = None) -> dict[str, Any]:
    """One run's row of the JSON from its summary.json. None: the run stopped on a
    non-finite loss, a result of its own (it diverged), or, with `failure` (the end of
    its output), it failed otherwise."""
    row: dict[str, Any] = {"case": case.label, "workload": w.name, "mult": case.mult,
                           "batch": w.ref_batch * case.mult, "optimizer": case.optimizer,
                           "rule": case.rule, "compression": case.compression_label,
                           "seconds": round(seconds, 1),
                           "diverged": summary is None and failure is None,
                           "failed": failure}
    if summary is None:
        return row
    traffic = summary.get("gradient_traffic") or {}
    return {**row, "metric": summary.get(f"val_{w.metric}"), "steps": summary.get("steps"),
            "samples_seen": summary.get("samples_seen"), "peak_lr": summary.get("peak_lr"),
            "bytes_per_step": traffic.get("bytes_per_step"),
            "uncompressed_bytes": traffic.get("uncompressed_bytes_per_step")}


def reference(results: Sequence[Mapping[str, Any]], workload: str) -> Mapping[str, Any] | None:
    """The workload's reference run: the first at 1x, uncompressed (the baseline's)."""
    return next((r for r in results if r["workload"] == workload and r["mult"] == 1
                 and r["compression"] == "none"), None)


def versus(value: float | None, ref: float | None) -> str:
    """'+0.0120' (value - ref), '-' when either is missing."""
    return "-" if value is None or ref is None else f"{value - ref:+.4f}"


def metric_text(r: Mapping[str, Any]) -> str:
    if r.get("failed"):
        return "failed"
    return "diverged" if r["diverged"] else (
        "-" if r.get("metric") is None else f"{r['metric']:.4f}")


def batch_rows(results: Sequence[Mapping[str, Any]]) -> list[list[Any]]:
    """The large-batch table: every uncompressed run, against its workload's reference."""
    rows = []
    for r in results:
        if r["compression"] != "none":
            continue
        ref = reference(results, r["workload"])
        rows.append([r["workload"], f"{r['batch']} ({r['mult']}x)", r["optimizer"],
                     "-" if r["mult"] == 1 else r["rule"], r.get("peak_lr"), r.get("steps"),
                     r.get("samples_seen"), metric_text(r),
                     "(reference)" if r is ref else versus(r.get("metric"),
                                                           ref and ref.get("metric"))])
    return rows


BATCH_HEADERS = ["workload", "global batch", "optimizer", "rule", "peak lr", "steps",
                 "samples seen", "val metric", "vs reference"]
COMPRESSION_HEADERS = ["workload", "compression", "MB/step sent", "of uncompressed",
                       "val metric", "vs none"]


def compression_rows(results: Sequence[Mapping[str, Any]]) -> list[list[Any]]:
    """The compression table: the reference run and each compressed one at 1x."""
    rows = []
    for r in results:
        ref = reference(results, r["workload"])
        if r["mult"] != 1 or (r is not ref and r["compression"] == "none"):
            continue
        sent, whole = r.get("bytes_per_step"), r.get("uncompressed_bytes")
        rows.append([r["workload"], r["compression"],
                     "-" if sent is None else f"{sent / 1e6:.4g}",
                     "-" if not sent or not whole else f"1/{whole / sent:.3g}",
                     metric_text(r), "(reference)" if r is ref else
                     versus(r.get("metric"), ref and ref.get("metric"))])
    return rows


def headline(results: Sequence[Mapping[str, Any]], workloads: Sequence[Workload],
             mult: int = 8) -> list[str]:
    """One line per workload: at `mult` x the reference batch, how far each optimizer and
    rule ends from the reference result."""
    lines = []
    for w in workloads:
        ref = reference(results, w.name)
        at = [r for r in results if r["workload"] == w.name and r["mult"] == mult
              and r["compression"] == "none"]
        if ref is None or not at or ref.get("metric") is None:
            continue
        parts = [f"{r['optimizer']} {r['rule']} "
                 + (metric_text(r) if r.get("metric") is None else
                    f"{r['metric']:.4f} ({versus(r['metric'], ref['metric'])})") for r in at]
        lines.append(f"{w.name} (val {w.metric}, reference {ref['metric']:.4f} with "
                     f"{ref['optimizer']} at batch {ref['batch']}): at {mult}x, "
                     + ", ".join(parts))
    return lines


# --------------------------------------------------------------------------- runs


def prepare(w: Workload, out: Path, timeout: float) -> Path:
    """The workload's data, written once into `out` (a recipe of this checkout)."""
    if (out / "val.h5").exists():
        return out
    cmd = [sys.executable, "-m", *w.prep, "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env=common.pythonpath_env(), check=False)
    if done.returncode:
        raise common.BenchError(f"preparing {out} failed:\n{done.stdout}{done.stderr}")
    return out


def loss_floor(data: Path) -> float | None:
    """The Markov corpus's entropy rate (the loss no model beats); None for other data."""
    import h5py  # only here: the parent process stays light

    with h5py.File(data / "val.h5", "r") as f:
        value = f.attrs.get("entropy_rate_nats")
    return None if value is None else float(value)


def run_case(w: Workload, case: Case, data: Path, work: Path, np: int,
             timeout: float) -> dict[str, Any]:
    """One case trained on `np` ranks; its result (a non-finite loss: diverged)."""
    run_dir = (work / case.label).resolve()
    start = time.monotonic()
    run = common.train_ranks(case_args(w, case, data.resolve(), run_dir), np, timeout)
    seconds = time.monotonic() - start
    if run.ok:
        return result_of(w, case, common.read_json(run_dir / "summary.json"), seconds)
    if not run.timed_out and "non-finite" in run.output:
        return result_of(w, case, None, seconds)
    # Any other failure is kept with its output and the next case runs: one bad setting
    # must not cost the quarter of an hour the others took.
    print(f"{case.label} failed:\n{run.describe()[-3000:]}", file=sys.stderr, flush=True)
    return result_of(w, case, None, seconds, failure=run.describe()[-3000:])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="hpcdp bench large-batch",
                                description=__doc__.splitlines()[0])
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--mults", default="1,8,32", help="global batches, in reference batches")
    p.add_argument("--compressions", default=",".join(DEFAULT_COMPRESSIONS),
                   help="none, bf16, fp16, powersgd:RANK (at the reference batch)")
    p.add_argument("--large", action="append", default=[], metavar="WORKLOAD=OPT:LR",
                   help="another large-batch optimizer and its rate (e.g. digits=sgd:0.02)")
    p.add_argument("--epochs", type=int, help="every workload's epochs (default: its own)")
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per run")
    p.add_argument("--out", default="bench/results")
    p.add_argument("--name", default="large-batch")
    args = cliargs.parse_args(p, argv)
    try:
        args.workloads = chosen_workloads(args)
        args.mults = sorted({int(m) for m in args.mults.split(",") if m.strip()} | {1})
        args.compressions = [c for c in args.compressions.split(",") if c.strip()]
        for c in args.compressions:
            parse_compression(c)
    except ValueError as e:
        p.error(str(e))
    if min(args.mults) < 1 or args.np < 1 or (args.epochs is not None and args.epochs < 1):
        p.error("--mults, --np and --epochs must be positive")
    return args


def chosen_workloads(args: argparse.Namespace) -> list[Workload]:
    """The --workloads, with --large and --epochs applied; a bad name is named."""
    from dataclasses import replace

    names = [n.strip() for n in args.workloads.split(",") if n.strip()]
    bad = [n for n in names if n not in WORKLOADS]
    if bad or not names:
        raise ValueError(f"--workloads: choose from {', '.join(WORKLOADS)}, got {names}")
    swaps = {}
    for item in args.large:
        name, _, spec = item.partition("=")
        opt, _, lr = spec.partition(":")
        if name not in WORKLOADS or not opt:
            raise ValueError(f"--large {item!r}: write WORKLOAD=OPTIMIZER[:LR]")
        swaps[name] = {"large": opt, **({"large_lr": float(lr)} if lr else {})}
    return [replace(WORKLOADS[n], **swaps.get(n, {}),
                    **({"epochs": args.epochs} if args.epochs else {})) for n in names]


def report(results: Sequence[Mapping[str, Any]], workloads: Sequence[Workload],
           floors: Mapping[str, float | None]) -> str:
    """The two tables, the floors and the headline, as printed."""
    lines = ["Large global batches, the same epochs (val metric: accuracy for digits, "
             "loss for gpt):", common.format_table(BATCH_HEADERS, batch_rows(results)), "",
             "Compression at the reference batch (bytes one rank hands to the gradient "
             "all-reduces per step):",
             common.format_table(COMPRESSION_HEADERS, compression_rows(results))]
    lines += [f"{name}: loss floor (the chain's entropy rate) {floor:.4f} nats/token"
              for name, floor in floors.items() if floor is not None]
    return "\n".join([*lines, "", *headline(results, workloads)])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    work = out / f"{args.name}-runs"
    results: list[dict[str, Any]] = []
    floors: dict[str, float | None] = {}
    todo = [(w, c) for w in args.workloads for c in cases(w, args.mults, args.compressions)]
    started = time.monotonic()
    try:
        data = {w.name: prepare(w, work / "data" / w.name, args.timeout)
                for w in args.workloads}
        floors = {name: loss_floor(path) for name, path in data.items()}
        for i, (w, case) in enumerate(todo, 1):
            results.append(run_case(w, case, data[w.name], work, args.np, args.timeout))
            print(f"[{i}/{len(todo)}] {case.label}: {metric_text(results[-1])} "
                  f"({results[-1]['seconds']:.0f} s)", flush=True)
    except (common.BenchError, OSError, ValueError) as e:
        print(f"hpcdp bench large-batch: {e}", file=sys.stderr)
        return 1
    text = report(results, args.workloads, floors)
    print(f"\n{text}\n({len(todo)} runs on {args.np} ranks in "
          f"{(time.monotonic() - started) / 60:.1f} min)")
    path = common.write_json(out / f"{args.name}.json", {
        "benchmark": "large-batch", "results": results, "floors": floors, "report": text,
        "params": {"np": args.np, "mults": args.mults, "compressions": args.compressions,
                   "workloads": [{**vars(w), "config": str(w.config)} for w in args.workloads]}})
    print(f"wrote {path}")
    failed = [r["case"] for r in results if r.get("failed")]
    if failed:
        print(f"hpcdp bench large-batch: {len(failed)} run(s) failed: {', '.join(failed)}",
              file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
