"""`hpcdp bench fusion`: many small asynchronous all-reduces with tensor fusion on and off.

The pattern is a backward pass's: N gradients of a few KiB each are handed to
`allreduce_async_` and then waited for. With fusion on, Horovod packs the
tensors that are ready in one cycle into one buffer and reduces it with one
MPI call; with HOROVOD_FUSION_THRESHOLD=0 each tensor is its own all-reduce
and pays the per-call latency. Each pair runs under one controller with
hpcdp's other settings, by default both MPI and Gloo (what one call costs
decides what fusion gains: a few tens of microseconds through MPI over shared
memory, about half a millisecond through Gloo's TCP); launches alternate
(off, on, off, on...) so that a burst of load elsewhere on the machine does not
land on one side only.

A third configuration per controller, 'buckets', is the fusion hpcdp trains
with on CPUs (hpcdp.runtime.grad_buckets): each tensor is handed over as a gradient,
copied into its place in a flat bucket (64 MiB), and each full bucket is reduced
in place with one all-reduce, with no copy out.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcdp.bench import common
from hpcdp.bench.allreduce import resolve_device
from hpcdp.bench.common import RunConfig
from hpcdp.cliargs import parse_args
from hpcdp.config import HorovodConfig
from hpcdp.runtime import hvd_settings
from hpcdp.runtime.launcher import LAUNCHERS

#: The controller compared beside `--launcher`'s: fusion's gain depends on what one call costs.
OTHER_CONTROLLER = {"mpirun": "horovodrun-gloo", "horovodrun": "horovodrun-gloo",
                    "horovodrun-gloo": "mpirun"}


def config_names(launcher: str) -> tuple[str, str, str]:
    """The (off, on, buckets) configuration names run under `launcher`."""
    pre = "gloo-" if launcher == "horovodrun-gloo" else ""
    return f"{pre}fusion-off", f"{pre}fusion-on", f"{pre}buckets"


def builtin_configs(launcher: str, other: bool = False, np: int = 2) -> dict[str, RunConfig]:
    """Fusion off, Horovod's fusion on, hpcdp's gradient buckets; else hpcdp's settings.

    'On' sets no threshold: the worker takes hpcdp's for its device and
    controller at init (hvd_settings.fusion_env), as training does. 'Buckets'
    hands the tensors to hpcdp.runtime.grad_buckets with training's CPU bucket size.

    With `other`, the same under the other controller too (MPI <-> Gloo),
    named with a 'gloo-' prefix for Gloo: each controller gives its own speedups.
    """
    tuned = hvd_settings.recommended_env(ranks=np)  # threads and yielding for np ranks
    out = {}
    for run in (launcher, OTHER_CONTROLLER[launcher]) if other else (launcher,):
        off, on, buckets = config_names(run)
        out[off] = RunConfig(off, run, {**tuned, "HOROVOD_FUSION_THRESHOLD": "0"})
        out[on] = RunConfig(on, run, tuned)
        out[buckets] = RunConfig(buckets, run, tuned,
                                 ("--bucket-bytes", str(hvd_settings.CPU_BUCKET_BYTES)))
    return out


def _worker(args: argparse.Namespace) -> int:
    """One rank: time rounds of N tensors reduced asynchronously, each handed to Horovod
    (in place) or, with --bucket-bytes, to hpcdp's gradient buckets; rank 0 writes the JSON."""
    # torch and Horovod in the ranks only: the parent that launches them must start fast.
    import horovod.torch as hvd
    import torch

    from hpcdp.runtime import dist

    device = resolve_device(args.device, torch.cuda.is_available())

    # Started as training starts it: the fusion threshold from the environment, else
    # hpcdp's rule for this device and controller.
    dist.init(HorovodConfig(), Path("."), on_gpu=device == "cuda")
    if device == "cuda":
        torch.cuda.set_device(hvd.local_rank())
    n = args.tensor_bytes // 4
    tensors = [torch.zeros(n, device=device) for _ in range(args.tensors)]
    gen = torch.Generator().manual_seed(0)
    a, b = (torch.randn(384, 384, generator=gen).to(device) for _ in range(2))

    def backward_work() -> None:
        for _ in range(args.compute_between):  # a backward pass's work between gradients
            torch.mm(a, b)

    if args.bucket_bytes:
        one_round, params = _bucket_round(hvd, tensors, args.bucket_bytes, backward_work)
    else:
        one_round, params = _horovod_round(hvd, tensors, backward_work), []

    seconds: list[float] = []
    for rnd in range(args.warmup + args.repeats):
        hvd.barrier()
        start = time.perf_counter()
        one_round()
        if device == "cuda":
            torch.cuda.synchronize()
        if rnd >= args.warmup:
            seconds.append(time.perf_counter() - start)
    if args.bucket_bytes:
        _check_bucket_means(hvd, params)
    gathered = hvd.allgather_object(seconds)
    worst = [max(s[i] for s in gathered) for i in range(args.repeats)]
    if hvd.rank() == 0:
        threshold = int(os.environ["HOROVOD_FUSION_THRESHOLD"])
        common.write_json(args.json, {"np": hvd.size(), "device": device, "seconds": worst,
                                      "fusion_threshold": threshold,
                                      "bucket_bytes": args.bucket_bytes})
    hvd.shutdown()
    return 0


def _horovod_round(hvd: Any, tensors: list[Any],
                   backward_work: Callable[[], None]) -> Callable[[], None]:
    """A round that hands each tensor to Horovod as backward makes it, then waits for all."""

    def one_round() -> None:
        handles = []
        for i, t in enumerate(tensors):
            backward_work()
            handles.append(hvd.allreduce_async_(t, op=hvd.Sum, name=f"grad.{i}"))
        for handle in handles:
            hvd.synchronize(handle)

    return one_round


def _bucket_round(hvd: Any, tensors: list[Any], bucket_bytes: int,
                  backward_work: Callable[[], None]) -> tuple[Callable[[], None], list[Any]]:
    """A round that hands each tensor to hpcdp's gradient buckets as a parameter's
    gradient, then waits for the buckets; and those parameters, to check after."""
    import torch  # in the ranks only: the parent that launches them stays torch-free

    from hpcdp.runtime.grad_buckets import bucketed

    # Each tensor is a parameter's gradient; the mean over ranks lands in its bucket.
    params = [torch.nn.Parameter(torch.zeros_like(t)) for t in tensors]
    opt = bucketed(torch.optim.SGD(params, lr=0.0), bucket_bytes)
    for t in tensors:
        t.fill_(hvd.rank() + 1)

    def one_round() -> None:
        for p, grad in zip(reversed(params), tensors, strict=True):  # backward's order
            backward_work()
            p.grad = grad
            opt.grad_ready(p)
        opt.synchronize()

    return one_round, params


def _check_bucket_means(hvd: Any, params: list[Any]) -> None:
    """Every gradient the buckets reduced is the mean of the ranks' (rank + 1)."""
    import torch  # in the ranks only, as above

    mean = (hvd.size() + 1) / 2
    wrong = [i for i, p in enumerate(params) if not torch.all(p.grad == mean)]
    if wrong:
        raise RuntimeError(f"gradient buckets: {len(wrong)} of {len(params)} gradients are "
                           f"not the mean over ranks ({mean}), e.g. parameter {wrong[0]}")


def summarize(
    results: Mapping[str, Sequence[float]], tensors: int, tensor_bytes: int
) -> dict[str, dict[str, Any]]:
    """Median round time per configuration, and the bytes per second it implies."""
    total = tensors * tensor_bytes
    out = {}
    for name, seconds in results.items():
        med = common.median(seconds)
        out[name] = {"seconds": list(seconds), "seconds_median": med,
                     "algbw_GBps": common.algbw(total, med)}
    return out


def speedup(summary: Mapping[str, Mapping[str, Any]], slow: str, fast: str) -> float | None:
    """How many times faster `fast` is than `slow` (median round times), if both ran."""
    if slow in summary and fast in summary:
        return summary[slow]["seconds_median"] / summary[fast]["seconds_median"]
    return None


def pair_speedups(launches: Mapping[str, Sequence[Sequence[float]]], slow: str,
                  fast: str) -> list[float]:
    """Speedup of each launch pair (the k-th launch of `slow` against the k-th of `fast`,
    which ran next to each other): the spread that the overall median hides."""
    if slow not in launches or fast not in launches:
        return []
    return [common.median(a) / common.median(b)
            for a, b in zip(launches[slow], launches[fast], strict=True) if a and b]


def fused_by(threshold: int, bucket_bytes: int) -> str:
    """What packs a configuration's tensors into fewer all-reduces, for the table."""
    if bucket_bytes:
        return f"hpcdp buckets {common.format_size(bucket_bytes)}"
    if threshold:
        return f"Horovod {common.format_size(threshold)}"
    return "nothing"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="hpcdp bench fusion",
        description="Tensor fusion on vs off: N small tensors reduced asynchronously.",
    )
    p.add_argument("--np", type=int, default=2, help="ranks (default 2)")
    p.add_argument("--tensors", type=int, default=200, help="tensors per round (default 200)")
    p.add_argument("--tensor-size", default="40KiB", help="bytes per tensor (default 40KiB)")
    p.add_argument("--compute-between", type=int, default=0, metavar="K",
                   help="384x384 matrix products before each tensor is handed over, making "
                   "a round a training-step proxy (default 0: communication only)")
    p.add_argument("--repeats", type=int, default=20, help="timed rounds per launch")
    p.add_argument("--warmup", type=int, default=3, help="untimed rounds first")
    p.add_argument("--pairs", type=int, default=2,
                   help="launches of each configuration, alternating (default 2)")
    p.add_argument("--launcher", default="mpirun", choices=LAUNCHERS)
    p.add_argument("--one-controller", action="store_true",
                   help="only --launcher's controller (default: the other one too, MPI <-> Gloo)")
    p.add_argument("--config", action="append", default=[], metavar="NAME=LAUNCHER[:K=V,...]",
                   help="an extra configuration, e.g. on-cyc5=fusion-on+HOROVOD_CYCLE_TIME=5")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                   help="tensors on the CPU or each rank's GPU; auto: the GPU when torch sees one")
    p.add_argument("--out", default="bench/results", help="folder for fusion.json/.png")
    p.add_argument("--name", default="fusion", help="file stem of the outputs")
    p.add_argument("--timeout", type=float, default=300.0, help="bound per launch, seconds")
    p.add_argument("--no-plot", action="store_true", help="skip the PNG")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--json", help=argparse.SUPPRESS)
    p.add_argument("--tensor-bytes", type=int, help=argparse.SUPPRESS)
    p.add_argument("--bucket-bytes", type=int, default=0, help=argparse.SUPPRESS)
    return p


def _checked(args: argparse.Namespace) -> tuple[int, list[RunConfig]]:
    """(bytes per tensor, the configurations) from the options; ValueError naming a bad one."""
    tensor_bytes = common.parse_size(args.tensor_size)
    if tensor_bytes % 4:
        raise ValueError(f"--tensor-size {args.tensor_size} is not whole float32 elements")
    if args.np < 2 or args.tensors < 1 or args.repeats < 1 or args.pairs < 1:
        raise ValueError("--np must be >= 2 and --tensors, --repeats, --pairs positive")
    if args.warmup < 0 or args.compute_between < 0:
        raise ValueError("--warmup and --compute-between must not be negative")
    builtin = builtin_configs(args.launcher, other=not args.one_controller, np=args.np)
    configs = list(builtin.values())
    configs += [common.parse_config(spec, builtin) for spec in args.config]
    names = [c.name for c in configs]
    if len(set(names)) != len(names):
        raise ValueError(f"configuration names must be unique: {names}")
    return tensor_bytes, configs


@dataclass
class Launches:
    """What the launches gave, per configuration: every round, each launch's rounds, the
    fusion threshold and bucket size its ranks ran with; and the device."""

    results: dict[str, list[float]]
    launches: dict[str, list[list[float]]]
    thresholds: dict[str, int] = field(default_factory=dict)
    bucket_bytes: dict[str, int] = field(default_factory=dict)
    device: str = "cpu"


def _launch_pairs(args: argparse.Namespace, configs: list[RunConfig],
                  worker_args: list[str]) -> Launches | None:
    """Every configuration launched --pairs times, alternating; None, once said why,
    when a launch fails."""
    done = Launches({c.name: [] for c in configs}, {c.name: [] for c in configs})
    with tempfile.TemporaryDirectory(prefix="hpcdp-bench-") as tmp:
        for pair in range(args.pairs):
            for config in configs:
                try:
                    raw = common.run_worker("hpcdp.bench.fusion", config, worker_args,
                                            Path(tmp) / f"{config.name}.{pair}.json",
                                            np=args.np, timeout=args.timeout)
                except (common.BenchError, FileNotFoundError, ValueError) as err:
                    print(f"hpcdp bench fusion: {err}", file=sys.stderr)
                    return None
                done.results[config.name] += raw["seconds"]
                done.launches[config.name].append(list(raw["seconds"]))
                done.thresholds[config.name] = raw["fusion_threshold"]
                done.bucket_bytes[config.name] = raw.get("bucket_bytes", 0)
                done.device = raw.get("device", "cpu")
    return done


@dataclass
class Speedups:
    """Per controller (its launcher): fusion off over on, off over hpcdp's buckets, each
    overall (None where a side did not run) and launch pair by launch pair."""

    fusion: dict[str, float | None]
    buckets: dict[str, float | None]
    fusion_pairs: dict[str, list[float]]
    bucket_pairs: dict[str, list[float]]


def speedups_of(summary: Mapping[str, Mapping[str, Any]],
                launches: Mapping[str, Sequence[Sequence[float]]], launcher: str) -> Speedups:
    names = {run: config_names(run) for run in (launcher, OTHER_CONTROLLER[launcher])}
    return Speedups(
        {run: speedup(summary, off, on) for run, (off, on, _) in names.items()},
        {run: speedup(summary, off, bk) for run, (off, _, bk) in names.items()},
        {run: pair_speedups(launches, off, on) for run, (off, on, _) in names.items()},
        {run: pair_speedups(launches, off, bk) for run, (off, _, bk) in names.items()})


def _print_results(args: argparse.Namespace, tensor_bytes: int, runs: Launches,
                   summary: Mapping[str, Mapping[str, Any]], gains: Speedups) -> None:
    rows = [[name, fused_by(runs.thresholds[name], runs.bucket_bytes[name]),
             s["seconds_median"] * 1e3, s["algbw_GBps"], len(s["seconds"])]
            for name, s in summary.items()]
    print(f"{args.tensors} tensors of {common.format_size(tensor_bytes)} handed over one by one, "
          f"then waited for, {args.np} ranks, {runs.device}; 'gloo-' rows under horovodrun "
          "--gloo, the others under the MPI controller; median of the rounds")
    print(common.format_table(["config", "fused by", "ms/round", "algbw GB/s", "rounds"], rows))
    for label, speedups, spreads in (("fusion speedup (off / on)", gains.fusion,
                                      gains.fusion_pairs),
                                     ("gradient buckets speedup (off / buckets)", gains.buckets,
                                      gains.bucket_pairs)):
        for run, g in speedups.items():
            if g is not None:
                spread = spreads[run]
                print(f"{label}, {run}: {g:.2f}x"
                      + (f" (launch pairs: {min(spread):.2f}-{max(spread):.2f}x)"
                         if len(spread) > 1 else ""))


def _payload(args: argparse.Namespace, tensor_bytes: int, configs: list[RunConfig],
             runs: Launches, summary: dict[str, dict[str, Any]],
             gains: Speedups) -> dict[str, Any]:
    other_gain = gains.fusion[OTHER_CONTROLLER[args.launcher]]
    return {
        "benchmark": "fusion",
        "np": args.np,
        "device": runs.device,
        "params": {"tensors": args.tensors, "tensor_bytes": tensor_bytes, "launcher": args.launcher,
                   "compute_between": args.compute_between,
                   "repeats": args.repeats, "warmup": args.warmup, "pairs": args.pairs},
        "configs": {c.name: {"launcher": c.launcher, "env": dict(c.env),
                             "fusion_threshold": runs.thresholds[c.name],
                             "bucket_bytes": runs.bucket_bytes[c.name]} for c in configs},
        "results": summary,
        "speedup": gains.fusion[args.launcher],
        "speedup_other": other_gain,
        "speedup_per_pair": {run: v for run, v in gains.fusion_pairs.items() if v},
        # hpcdp's gradient buckets (what CPU training uses) against fusion off.
        "speedup_buckets": {run: g for run, g in gains.buckets.items() if g is not None},
        "speedup_buckets_per_pair": {run: v for run, v in gains.bucket_pairs.items() if v},
        "other_launcher": OTHER_CONTROLLER[args.launcher] if other_gain is not None else None,
    }


def _plot(path: Path, args: argparse.Namespace, tensor_bytes: int,
          summary: Mapping[str, Mapping[str, Any]], gains: Speedups) -> Path:
    medians = {k: v["seconds_median"] * 1e3 for k, v in summary.items()}
    points = {k: [t * 1e3 for t in v["seconds"]] for k, v in summary.items()}
    title = f"{args.tensors} x {common.format_size(tensor_bytes)} async all-reduce"
    gain, bucket_gain = gains.fusion[args.launcher], gains.buckets[args.launcher]
    if gain is not None:
        title += f": fusion {gain:.1f}x faster"
    if bucket_gain is not None:
        title += f", buckets {bucket_gain:.1f}x"
    return common.plot_bars(path, medians, "ms per round", title, points)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(build_parser(), argv)
    if args.worker:
        return _worker(args)
    try:
        tensor_bytes, configs = _checked(args)
    except ValueError as err:
        print(f"hpcdp bench fusion: {err}", file=sys.stderr)
        return 2

    worker_args = ["--tensors", str(args.tensors), "--tensor-bytes", str(tensor_bytes),
                   "--repeats", str(args.repeats), "--warmup", str(args.warmup),
                   "--device", args.device, "--compute-between", str(args.compute_between)]
    runs = _launch_pairs(args, configs, worker_args)
    if runs is None:
        return 1
    summary = summarize(runs.results, args.tensors, tensor_bytes)
    gains = speedups_of(summary, runs.launches, args.launcher)
    _print_results(args, tensor_bytes, runs, summary, gains)
    out = Path(args.out)
    payload = _payload(args, tensor_bytes, configs, runs, summary, gains)
    print(f"wrote {common.write_json(out / f'{args.name}.json', payload)}")
    if not args.no_plot:
        print(f"wrote {_plot(out / f'{args.name}.png', args, tensor_bytes, summary, gains)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
