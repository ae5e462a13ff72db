"""`hpcdp bench allreduce`: all-reduce bandwidth, Horovod vs raw MPI vs memcpy, side by side.

The parent process launches this same module (`--worker`) once per
configuration (a launcher and its environment: Horovod's defaults, hpcdp's
settings, MPI or Gloo controller). Inside one launch every column runs on the
same buffers, interleaved round by round, so a ratio such as Horovod/raw MPI
compares figures measured at the same moment on a noisy machine.

Columns (all on float32 buffers of the given size):
  memcpy   torch copy_ between two warm buffers: what one core can move.
  alloc    a fresh torch.empty(...).fill_(0): the cost of writing into newly
           allocated memory (not measured unless asked for).
  mpi_solo mpi4py Allreduce(src, dst) before Horovod starts: MPI alone.
  mpi      the same beside an initialized Horovod (its background thread
           polls every cycle): the reference for the hvd/mpi ratios.
  mpi_     mpi4py Allreduce(IN_PLACE, buf).
  mpi_new  mpi4py Allreduce(src, torch.empty(...)): out of place into a
           fresh output each call, as hvd.allreduce does.
  hvd     hvd.allreduce(src): out of place, Horovod allocates the output.
  hvd_    hvd.allreduce_(buf): in place, as DistributedOptimizer reduces gradients.
  hvd_avg hvd.allreduce_(buf, op=Average): DistributedOptimizer's default op,
          which adds a scaling pass over the buffer after the sum.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcdp.bench import common
from hpcdp.bench.common import RunConfig
from hpcdp.cliargs import parse_args
from hpcdp.config import HorovodConfig
from hpcdp.runtime import hvd_settings

COLUMNS = ("memcpy", "alloc", "mpi_solo", "mpi", "mpi_", "mpi_new", "hvd", "hvd_", "hvd_avg")
DEFAULT_COLUMNS = ("memcpy", "mpi_solo", "mpi", "mpi_", "mpi_new", "hvd", "hvd_", "hvd_avg")
MPI_ONLY = ("mpi_solo", "mpi", "mpi_", "mpi_new")
HVD_COLUMNS = ("hvd", "hvd_", "hvd_avg")
DEFAULT_SIZES = "4KiB..256MiB"
DEFAULT_CONFIGS = ("mpi-default", "mpi-hpcdp", "gloo-default", "gloo-hpcdp")


def builtin_configs(np: int = 2) -> dict[str, RunConfig]:
    """Horovod's own defaults vs hpcdp's settings (for `np` ranks), under MPI and Gloo."""
    default, tuned = hvd_settings.default_env(), hvd_settings.recommended_env(ranks=np)
    return {
        "mpi-default": RunConfig("mpi-default", "mpirun", default),
        "mpi-hpcdp": RunConfig("mpi-hpcdp", "mpirun", tuned),
        "gloo-default": RunConfig("gloo-default", "horovodrun-gloo", default),
        "gloo-hpcdp": RunConfig("gloo-hpcdp", "horovodrun-gloo", tuned),
    }


def iters_for(nbytes: int, budget: int, lo: int = 1, hi: int = 50) -> int:
    """Ops per timed block: about `budget` bytes each, within [lo, hi].

    A pure function of the size, so every rank agrees without communicating.
    """
    if nbytes <= 0 or budget <= 0:
        raise ValueError("size and budget must be positive")
    return max(lo, min(hi, budget // nbytes))


# --------------------------------------------------------------------------- worker


def _time_op(
    op: Callable[[], object],
    iters: int,
    sync: Callable[[], None],
    fence: Callable[[], None] | None = None,
) -> float:
    """Seconds per call of `op`, over `iters` calls started together on every rank.

    `fence` waits for queued device work (a GPU copy returns before it is done).
    """
    sync()
    start = time.perf_counter()
    for _ in range(iters):
        op()
    if fence is not None:
        fence()
    return (time.perf_counter() - start) / iters


def resolve_device(requested: str, cuda_available: bool) -> str:
    """'cpu' or 'cuda' for --device auto|cpu|cuda; asking for cuda without one is an error."""
    if requested == "auto":
        return "cuda" if cuda_available else "cpu"
    if requested == "cuda" and not cuda_available:
        raise ValueError("--device cuda: torch sees no CUDA device on this rank")
    if requested not in ("cpu", "cuda"):
        raise ValueError(f"unknown device {requested!r}; choose auto, cpu or cuda")
    return requested


def _compute_rounds(rounds: int, sync: Callable[[], None]) -> list[float]:
    """Seconds per round of a fixed matrix-multiply workload: a training step's compute in small.

    Timed once before `hvd.init()` and once after it, while Horovod is idle, it
    shows what the background thread's polling every cycle costs the compute
    that shares its cores.
    """
    import torch

    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(256, 256, generator=gen), torch.randn(256, 256, generator=gen)
    for _ in range(5):  # untimed: the first products pay one-off library set-up
        torch.mm(a, b)
    out = []
    for _ in range(rounds):
        sync()
        start = time.perf_counter()
        for _ in range(20):
            torch.mm(a, b)
        out.append(time.perf_counter() - start)
    return out


def _worst(gathered: Sequence[Mapping[str, list[float]]], col: str, repeats: int) -> list[float]:
    """The slowest rank's time per round: a collective ends when its last rank does."""
    return [max(t[col][i] for t in gathered) for i in range(repeats)]


def _rotated(items: Sequence[str], shift: int) -> list[str]:
    """`items` starting at `shift`: each round a different column runs first."""
    k = shift % len(items) if items else 0
    return list(items[k:]) + list(items[:k])


@dataclass(frozen=True)
class Measure:
    """What every rank measures: the sizes, the columns, on which device, how often."""

    sizes: list[int]
    columns: list[str]
    device: str
    with_mpi: bool  # raw mpi4py columns: MPI ranks and host memory
    iters: int  # ops per timed block; 0: about `budget` bytes (iters_for)
    budget: int
    warmup: int
    repeats: int

    def iters_of(self, nbytes: int) -> int:
        return self.iters or iters_for(nbytes, self.budget)


def measure_of(args: argparse.Namespace, cuda_available: bool) -> Measure:
    """The worker's arguments as a Measure (the parent checked them)."""
    sizes = [int(s) for s in args.sizes.split(",")]
    budget = common.parse_size(args.budget)
    device = resolve_device(args.device, cuda_available)
    # Raw MPI needs MPI ranks, and host memory (CUDA-aware MPI is not assumed).
    with_mpi = args.mpi and device == "cpu"
    columns = [c for c in args.columns.split(",") if with_mpi or c not in MPI_ONLY]
    return Measure(sizes, columns, device, with_mpi, args.iters, budget, args.warmup,
                   args.repeats)


def _buffers(nbytes: int, device: str) -> tuple[Any, Any, Any]:
    """(ones, empty, zeros): float32 buffers of `nbytes` on `device`."""
    import torch  # in the ranks only: the parent that launches them stays torch-free

    n = nbytes // 4
    return (torch.ones(n, device=device), torch.empty(n, device=device),
            torch.zeros(n, device=device))


def _no_sync() -> None:
    return None


def _worker(args: argparse.Namespace) -> int:
    """One rank: measure every column at every size, then rank 0 writes the JSON.

    Horovod cannot be restarted in the same process once HOROVOD_CYCLE_TIME or
    HOROVOD_FUSION_THRESHOLD is set (0.28.1 crashes in its parameter manager),
    so what needs Horovod absent (`mpi_solo`, the compute probe alone) runs
    first, then Horovod starts and the other columns run interleaved.
    """
    import torch

    m = measure_of(args, torch.cuda.is_available())
    fence = torch.cuda.synchronize if m.device == "cuda" else None
    comm = mpi = None
    times: dict[int, dict[str, list[float]]] = {n: {c: [] for c in m.columns} for n in m.sizes}
    if m.with_mpi:
        from mpi4py import MPI  # initializes MPI with MPI_THREAD_MULTIPLE, as Horovod asks

        mpi, comm = MPI, MPI.COMM_WORLD
        if "mpi_solo" in m.columns:
            _mpi_solo_rounds(m, mpi, times)
    compute = {"solo": _compute_rounds(args.compute_rounds, comm.Barrier if comm else _no_sync)}

    # Horovod in the ranks only: the parent that launches them must start fast.
    import horovod.torch as hvd

    from hpcdp.runtime import dist

    # Started as training starts it: the fusion threshold from the environment, else
    # hpcdp's rule for this device and controller.
    dist.init(HorovodConfig(), Path("."), on_gpu=m.device == "cuda")
    if m.device == "cuda":
        torch.cuda.set_device(hvd.local_rank())
    hvd.barrier()
    compute["beside_hvd"] = _compute_rounds(args.compute_rounds, _no_sync)

    def sync() -> None:
        if comm is not None:
            comm.Barrier()
        else:
            hvd.barrier()

    live_cols = [c for c in m.columns if c != "mpi_solo"]
    for nbytes in m.sizes:
        ops = _ops(nbytes, m.device, hvd, mpi)
        for rnd in range(m.warmup + m.repeats):
            for col in _rotated(live_cols, rnd):
                secs = _time_op(ops[col], m.iters_of(nbytes), sync, fence)
                if rnd >= m.warmup:
                    times[nbytes][col].append(secs)
        del ops  # the buffers go with the operations that hold them
    _gather_and_write(args.json, m, times, compute, hvd)
    hvd.shutdown()
    return 0


def _mpi_solo_rounds(m: Measure, mpi: Any, times: dict[int, dict[str, list[float]]]) -> None:
    """The `mpi_solo` column at every size, before Horovod starts."""
    comm = mpi.COMM_WORLD
    for nbytes in m.sizes:
        src, dst, _ = _buffers(nbytes, m.device)
        s_np, d_np = src.numpy(), dst.numpy()
        for rnd in range(m.warmup + m.repeats):
            secs = _time_op(lambda s=s_np, d=d_np: comm.Allreduce(s, d, op=mpi.SUM),
                            m.iters_of(nbytes), comm.Barrier)
            if rnd >= m.warmup:
                times[nbytes]["mpi_solo"].append(secs)
        del src, dst, s_np, d_np


def _ops(nbytes: int, device: str, hvd: Any, mpi: Any | None) -> dict[str, Callable[[], object]]:
    """Every column's operation on buffers of `nbytes` of its own (the calls hold them);
    the raw MPI ones only with `mpi` (mpi4py's MPI), on the same buffers' memory."""
    import torch  # in the ranks only, as above

    n = nbytes // 4
    src, dst, buf = _buffers(nbytes, device)
    ops: dict[str, Callable[[], object]] = {
        "memcpy": lambda dst=dst, src=src: dst.copy_(src),
        "alloc": lambda n=n: torch.empty(n, device=device).fill_(0.0),
        "hvd": lambda src=src, k=nbytes: hvd.allreduce(src, op=hvd.Sum, name=f"ar.{k}"),
        "hvd_": lambda buf=buf, k=nbytes: hvd.allreduce_(buf, op=hvd.Sum, name=f"ar_.{k}"),
        "hvd_avg": lambda buf=buf, k=nbytes: hvd.allreduce_(buf, name=f"avg_.{k}"),
    }
    if mpi is not None:
        comm = mpi.COMM_WORLD
        s_np, d_np, b_np = src.numpy(), dst.numpy(), buf.numpy()
        ops["mpi"] = lambda s=s_np, d=d_np: comm.Allreduce(s, d, op=mpi.SUM)
        ops["mpi_"] = lambda b=b_np: comm.Allreduce(mpi.IN_PLACE, b, op=mpi.SUM)
        ops["mpi_new"] = lambda s=s_np, n=n: comm.Allreduce(s, torch.empty(n).numpy(),
                                                            op=mpi.SUM)
    return ops


def _gather_and_write(json_path: str, m: Measure, times: dict[int, dict[str, list[float]]],
                      compute: dict[str, list[float]], hvd: Any) -> None:
    """Every rank's times gathered (collectives: every rank calls this); rank 0 writes
    the slowest rank's per round, with each rank's compute probe."""
    gathered = hvd.allgather_object(times)
    rows: list[dict[str, Any]] = []
    for nbytes in m.sizes:
        for col in (c for c in COLUMNS if c in m.columns):
            worst = _worst([g[nbytes] for g in gathered], col, m.repeats)
            rows.append({"column": col, "bytes": nbytes, "iters": m.iters_of(nbytes),
                         "seconds": worst})
    computes = hvd.allgather_object(compute)
    columns = [c for c in COLUMNS if c in m.columns]
    if hvd.rank() == 0:
        common.write_json(json_path, {
            "np": hvd.size(),
            "device": m.device,
            "fusion_threshold": int(os.environ["HOROVOD_FUSION_THRESHOLD"]),
            "columns": columns,
            "mpi_threads_supported": bool(hvd.mpi_threads_supported()) if m.with_mpi else None,
            "rows": rows,
            # Per rank: seconds per compute round before hvd.init() and beside idle Horovod.
            "compute": computes,
        })


# --------------------------------------------------------------------------- report


def summarize(config: RunConfig, raw: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Median time, algbw and busbw per (column, size) of one configuration's worker output."""
    nranks = int(raw["np"])
    out = []
    for row in raw["rows"]:
        secs = common.median(row["seconds"])
        alg = common.algbw(row["bytes"], secs)
        collective = row["column"] in MPI_ONLY + HVD_COLUMNS
        out.append({
            "config": config.name,
            "launcher": config.launcher,
            "column": row["column"],
            "bytes": row["bytes"],
            "iters": row["iters"],
            "seconds": row["seconds"],
            "seconds_median": secs,
            "algbw_GBps": alg,
            "busbw_GBps": common.allreduce_busbw(alg, nranks) if collective else alg,
        })
    return out


def idle_cost(raw: Mapping[str, Any]) -> dict[str, float] | None:
    """The compute probe's medians, and how much slower compute ran beside idle Horovod.

    The slowest rank decides a data-parallel step, so each side is its slowest rank's median.
    """
    ranks = raw.get("compute") or []
    if not ranks:
        return None
    solo = max(common.median(r["solo"]) for r in ranks)
    beside = max(common.median(r["beside_hvd"]) for r in ranks)
    return {"solo_s": solo, "beside_hvd_s": beside, "slowdown": beside / solo}


def add_ratios(rows: list[dict[str, Any]], reference: str | None) -> None:
    """Set `vs_mpi` on Horovod rows: busbw over raw MPI's at the same size.

    Raw MPI comes from the same configuration (same launch) where it ran; a
    Gloo launch has no MPI, so it is compared with the `reference` configuration.
    """
    mpi = {(r["config"], r["bytes"]): r["busbw_GBps"] for r in rows if r["column"] == "mpi"}
    for row in rows:
        if row["column"] not in HVD_COLUMNS:
            continue
        base = mpi.get((row["config"], row["bytes"]))
        if base is None and reference is not None:
            base = mpi.get((reference, row["bytes"]))
        row["vs_mpi"] = row["busbw_GBps"] / base if base else None


def tables(
    rows: Sequence[Mapping[str, Any]],
    nranks: int,
    idle: Mapping[str, Mapping[str, float] | None] | None = None,
) -> str:
    """One table per configuration: busbw per column, then Horovod over raw MPI."""
    factor = 2 * (nranks - 1) / nranks
    parts = [
        f"All-reduce on {nranks} ranks: busbw in GB/s (1e9 B/s), the median of the repeats; "
        f"busbw = algbw x 2(n-1)/n = algbw x {factor:.2f}.\nmemcpy and alloc are one rank's "
        f"local rates. X/mpi is column X's busbw over raw mpi4py's out-of-place Allreduce on "
        f"the same buffers (a Gloo launch uses the reference MPI launch's)."
    ]
    for config in dict.fromkeys(r["config"] for r in rows):
        mine = [r for r in rows if r["config"] == config]
        columns = list(dict.fromkeys(r["column"] for r in mine))
        sizes = sorted({r["bytes"] for r in mine})
        cell = {(r["column"], r["bytes"]): r for r in mine}
        ratio_cols = [c for c in HVD_COLUMNS if c in columns]
        headers = ["size"] + columns + [f"{c}/mpi" for c in ratio_cols]
        body = []
        for size in sizes:
            line: list[Any] = [common.format_size(size)]
            line += [cell[(c, size)]["busbw_GBps"] for c in columns]
            line += [cell[(c, size)].get("vs_mpi") for c in ratio_cols]
            body.append(line)
        launcher = mine[0]["launcher"]
        parts.append(f"\n[{config}] ({launcher})\n" + common.format_table(headers, body))
        cost = (idle or {}).get(config)
        if cost:
            parts.append(f"compute beside idle Horovod: {cost['slowdown']:.2f}x the time "
                         f"before hvd.init() ({cost['solo_s'] * 1e3:.1f} -> "
                         f"{cost['beside_hvd_s'] * 1e3:.1f} ms per round)")
    return "\n".join(parts)


LINE_STYLES = {"mpi_solo": {"linestyle": ":", "marker": "v"},
               "mpi": {"linestyle": ":", "marker": "^"},
               "hvd": {"linestyle": "-", "marker": "o"},
               "hvd_": {"linestyle": "--", "marker": "s"},
               "hvd_avg": {"linestyle": "-.", "marker": "x"}}


def plot(rows: Sequence[Mapping[str, Any]], path: Path, nranks: int) -> Path:
    """Bandwidth vs size (log x): a colour per configuration, a line style per column.

    The right panel is Horovod's share of raw MPI, with the 80% target drawn.
    """
    sizes = sorted({r["bytes"] for r in rows})
    bw: dict[str, tuple[list[float], list[float]]] = {}
    ratio: dict[str, tuple[list[float], list[float]]] = {}
    styles: dict[str, dict[str, Any]] = {}
    configs = list(dict.fromkeys(r["config"] for r in rows))
    memcpy = sorted((r for r in rows if r["column"] == "memcpy" and r["config"] == configs[-1]),
                    key=lambda r: r["bytes"])
    if memcpy:
        label = f"memcpy, one rank ({configs[-1]})"
        bw[label] = ([r["bytes"] for r in memcpy], [r["busbw_GBps"] for r in memcpy])
        styles[label] = {"color": "black", "linestyle": "--", "marker": None}
    for i, config in enumerate(configs):
        mine = sorted((r for r in rows if r["config"] == config), key=lambda r: r["bytes"])
        for col, style in LINE_STYLES.items():
            pts = [r for r in mine if r["column"] == col]
            if not pts:
                continue
            label = f"{config} {col}"
            styles[label] = {**style, "color": f"C{i}", "markersize": 4}
            bw[label] = ([r["bytes"] for r in pts], [r["busbw_GBps"] for r in pts])
            if col in HVD_COLUMNS and all(r.get("vs_mpi") for r in pts):
                ratio[label] = ([r["bytes"] for r in pts], [r["vs_mpi"] for r in pts])
    ticks = {s: common.format_size(s).replace(" ", "") for s in sizes}
    panels = [
        {"series": bw, "styles": styles, "title": f"all-reduce busbw, {nranks} ranks",
         "xlabel": "buffer size", "ylabel": "busbw (GB/s)", "logx": True, "logy": True,
         "xticks": ticks},
        {"series": ratio, "styles": styles, "title": "Horovod busbw / raw MPI busbw",
         "xlabel": "buffer size", "ylabel": "ratio", "logx": True, "hline": 0.8,
         "xticks": ticks},
    ]
    return common.plot_panels(path, panels)


# --------------------------------------------------------------------------- entry


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="hpcdp bench allreduce",
        description="All-reduce bandwidth: Horovod (MPI and Gloo controllers, default and "
        "hpcdp settings) vs raw mpi4py vs memcpy, measured side by side.",
    )
    p.add_argument("--np", type=int, default=2, help="ranks (default 2)")
    p.add_argument("--sizes", default=DEFAULT_SIZES,
                   help="LO..HI (x4 steps) or a comma list, e.g. 4KiB,64MiB (default %(default)s)")
    p.add_argument("--iters", type=int, default=0,
                   help="ops per timed block (default: about --budget bytes, 1..50)")
    p.add_argument("--budget", default="128MiB", help="bytes per timed block when --iters is 0")
    p.add_argument("--repeats", type=int, default=5, help="timed rounds; the median is reported")
    p.add_argument("--warmup", type=int, default=1, help="untimed rounds first")
    p.add_argument("--configs", default=",".join(DEFAULT_CONFIGS),
                   help="built-in configurations to run, comma-separated (default %(default)s)")
    p.add_argument("--config", action="append", default=[], metavar="NAME=LAUNCHER[:K=V,...]",
                   help="an extra configuration, e.g. cyc5=mpi-hpcdp+HOROVOD_CYCLE_TIME=5")
    p.add_argument("--columns", default=",".join(DEFAULT_COLUMNS),
                   help=f"columns to measure, from {', '.join(COLUMNS)} (default %(default)s)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                   help="buffers on the CPU or on each rank's GPU (NCCL path; no raw-MPI "
                   "columns); auto: the GPU when torch sees one")
    p.add_argument("--out", default="bench/results", help="folder for allreduce.json/.png")
    p.add_argument("--name", default="allreduce", help="file stem of the outputs")
    p.add_argument("--timeout", type=float, default=900.0, help="bound per launch, seconds")
    p.add_argument("--no-plot", action="store_true", help="skip the PNG")
    p.add_argument("--compute-rounds", type=int, default=10,
                   help="rounds of the compute probe, before and after hvd.init() (default 10)")
    # Internal: how the parent starts the ranks.
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--json", help=argparse.SUPPRESS)
    p.add_argument("--mpi", action="store_true", help=argparse.SUPPRESS)
    return p


def _configs(args: argparse.Namespace) -> list[RunConfig]:
    builtin = builtin_configs(args.np)
    chosen = []
    for name in filter(None, (c.strip() for c in args.configs.split(","))):
        if name not in builtin:
            raise ValueError(f"unknown configuration {name!r}; built-in: {', '.join(builtin)}")
        chosen.append(builtin[name])
    chosen += [common.parse_config(spec, builtin) for spec in args.config]
    names = [c.name for c in chosen]
    if len(set(names)) != len(names) or not names:
        raise ValueError(f"configuration names must be unique and not empty: {names}")
    return chosen


def _checked(args: argparse.Namespace) -> tuple[list[int], int, list[RunConfig], list[str]]:
    """(sizes, budget, configurations, columns) from the options; ValueError naming a bad one."""
    sizes = common.parse_sizes(args.sizes)
    budget = common.parse_size(args.budget)
    configs = _configs(args)
    columns = [c.strip() for c in args.columns.split(",") if c.strip()]
    unknown = sorted(set(columns) - set(COLUMNS))
    if unknown:
        raise ValueError(f"unknown columns {unknown}; choose from {', '.join(COLUMNS)}")
    if args.np < 2:
        raise ValueError("--np must be at least 2 for an all-reduce benchmark")
    if min(args.repeats, args.compute_rounds, args.warmup + 1, args.iters + 1) < 1:
        raise ValueError("--repeats and --compute-rounds must be positive; "
                         "--warmup and --iters not negative")
    bad = [s for s in sizes if s % 4]
    if bad:
        raise ValueError(f"sizes must be whole float32 buffers (multiples of 4 B): {bad}")
    return sizes, budget, configs, columns


@dataclass
class Launches:
    """What the configurations' launches gave: summarized rows, and per configuration its
    idle cost, device and fusion threshold."""

    rows: list[dict[str, Any]]
    idle: dict[str, dict[str, float] | None]
    devices: dict[str, str]
    fusion: dict[str, int | None]


def _launch_all(args: argparse.Namespace, configs: list[RunConfig],
                worker_args: list[str]) -> Launches | None:
    """Each configuration launched in turn; None, once said why, when a launch fails."""
    done = Launches([], {}, {}, {})
    with tempfile.TemporaryDirectory(prefix="hpcdp-bench-") as tmp:
        for config in configs:
            print(f"[{config.name}] {config.launcher}, {args.np} ranks, "
                  f"env {dict(config.env)}", flush=True)
            extra = ["--mpi"] if config.uses_mpi else []
            try:
                raw = common.run_worker("hpcdp.bench.allreduce", config, worker_args + extra,
                                        Path(tmp) / f"{config.name}.json", np=args.np,
                                        timeout=args.timeout)
            except (common.BenchError, FileNotFoundError, ValueError) as err:
                print(f"hpcdp bench allreduce: {err}", file=sys.stderr)
                return None
            done.rows += summarize(config, raw)
            done.idle[config.name] = idle_cost(raw)
            done.devices[config.name] = raw.get("device", "cpu")
            done.fusion[config.name] = raw.get("fusion_threshold")
    return done


def main(argv: list[str] | None = None) -> int:
    args = parse_args(build_parser(), argv)
    if args.worker:
        return _worker(args)
    try:
        sizes, budget, configs, columns = _checked(args)
    except ValueError as err:
        print(f"hpcdp bench allreduce: {err}", file=sys.stderr)
        return 2

    out = Path(args.out)
    worker_args = [
        "--sizes", ",".join(map(str, sizes)), "--iters", str(args.iters),
        "--budget", str(budget), "--repeats", str(args.repeats), "--warmup", str(args.warmup),
        "--columns", ",".join(columns), "--compute-rounds", str(args.compute_rounds),
        "--device", args.device,
    ]
    launches = _launch_all(args, configs, worker_args)
    if launches is None:
        return 1
    rows = launches.rows
    mpi_configs = list(dict.fromkeys(r["config"] for r in rows if r["column"] == "mpi"))
    reference = "mpi-hpcdp" if "mpi-hpcdp" in mpi_configs else next(iter(mpi_configs), None)
    add_ratios(rows, reference)
    print(tables(rows, args.np, launches.idle))
    payload = {
        "benchmark": "allreduce",
        "np": args.np,
        "params": {"sizes": sizes, "iters": args.iters, "budget": budget,
                   "repeats": args.repeats, "warmup": args.warmup, "columns": columns},
        "configs": {c.name: {"launcher": c.launcher, "env": dict(c.env),
                             "device": launches.devices.get(c.name),
                             "fusion_threshold": launches.fusion.get(c.name)}
                    for c in configs},
        "reference_mpi_config": reference,
        "rows": rows,
        "idle_compute": launches.idle,
    }
    json_path = common.write_json(out / f"{args.name}.json", payload)
    print(f"\nwrote {json_path}")
    if not args.no_plot:
        print(f"wrote {plot(rows, out / f'{args.name}.png', args.np)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
