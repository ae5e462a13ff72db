"""`hpcdp bench reader`: the sharded reader vs raw slab reads vs a per-sample DataLoader.

One process, page cache warm, CIFAR-like uint8 samples by default. Each round
measures, back to back on the same file:

  raw       h5py slab reads of one chunk each (``dset[a:b]``), in file order:
            the most the file can give through h5py (no shuffle, no labels).
  reader    `ShardedReader`, one full epoch (shuffled, with labels) of a reader
            kept open from round to round, as training keeps it from epoch to
            epoch, after one untimed epoch (the file opened before the clock
            starts, as for raw).
  baseline  the usual map-style Dataset whose ``__getitem__`` reads one sample
            from h5py, under a DataLoader with DistributedSampler(1 replica).

Ratios are taken within a round, then the median over rounds, so load from
other work on a shared machine affects both sides of a ratio alike. The
reader's resident memory is sampled during an untimed epoch of each round (the
sampling would slow the timed one by ~3%), in total and anonymous
(the process's own allocations; the rest is mostly file pages mapped from the
page cache, which the reader unmaps window by window). With a file at least 4x
its window, anonymous memory must stay flat once the reader's buffers exist,
and the total must stay within about two windows plus the prefetched batches,
not grow with the file (it moves by up to a window as one is mapped and dropped).
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from hpcdp.bench import common
from hpcdp.cliargs import parse_args

MIB = 2**20


def result_path(out: str, name: str) -> Path:
    """`--out` names the JSON file, or a folder (as `hpcdp bench all --out DIR`) for NAME.json."""
    path = Path(out)
    return path if path.suffix == ".json" else path / f"{name}.json"


def _raw_pass(path: str, x_name: str) -> tuple[int, float]:
    import h5py

    with h5py.File(path, "r") as f:
        d = f[x_name]
        n = d.shape[0]
        step = d.chunks[0] if d.chunks else 256
        start = time.perf_counter()
        for a in range(0, n, step):
            d[a : a + step]
        return n, time.perf_counter() - start


def _memory(proc: Any) -> tuple[int, int]:
    """(resident bytes, anonymous resident bytes): one cheap call inside the timed loop.

    On Linux psutil's `shared` is RssFile + RssShmem, so RSS less it is RssAnon;
    where `shared` is missing, both numbers are the RSS.
    """
    mem = proc.memory_info()
    return int(mem.rss), int(mem.rss - getattr(mem, "shared", 0))


def _warm_up(r: Any) -> None:
    """One untimed epoch; no batch outlives it (a batch held keeps its buffers busy)."""
    for _ in r:
        pass


def _reader_pass(r: Any, epoch: int) -> tuple[int, float]:
    """One timed epoch of an open reader: (samples, seconds), nothing else in the loop."""
    r.set_epoch(epoch)
    n = 0
    start = time.perf_counter()
    for x, _ in r:
        n += len(x)
    return n, time.perf_counter() - start


def _memory_pass(r: Any, epoch: int, before: tuple[int, int]) -> dict[str, Any]:
    """One untimed epoch of the same reader, sampling its memory every 8 batches.

    Apart from the timed epoch: a sample costs ~20 us, ~3% of the epoch in all,
    which would be billed to the reader.
    """
    import psutil

    proc = psutil.Process()
    rss_before, anon_before = before
    r.set_epoch(epoch)
    steps = len(r)
    samples: list[tuple[int, int, int]] = []  # (batch index, RSS, anonymous RSS)
    for i, _ in enumerate(r):
        if i % 8 == 0:
            samples.append((i, *_memory(proc)))
    samples.append((steps, *_memory(proc)))
    half = max(rss for i, rss, _ in samples if i <= steps // 2)
    peak = max(rss for _, rss, _ in samples)
    anon_half = max(a for i, _, a in samples if i <= steps // 2)
    anon_peak = max(a for _, _, a in samples)
    prefetch_bytes = (r.prefetch + 2) * r.batch_size * r.info.sample_bytes
    return {"window_bytes": r.window_bytes,
            "window_samples": r.window, "virtual_shards": r.virtual_shards,
            "prefetch_bytes": prefetch_bytes, "rss_before": rss_before,
            "rss_first_half": half, "rss_peak": peak, "mapped": r.mapped,
            "anon_before": anon_before, "anon_first_half": anon_half,
            "anon_peak": anon_peak}


class PerSampleDataset:
    """The common baseline: one h5py read per sample, file opened lazily per process."""

    def __init__(self, path: str, x_name: str, y_name: str) -> None:
        import h5py

        self.path, self.x_name, self.y_name = path, x_name, y_name
        with h5py.File(path, "r") as f:
            self.n = int(f[x_name].shape[0])
        self._f: Any = None

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[Any, int]:
        import h5py
        import torch

        if self._f is None:
            self._f = h5py.File(self.path, "r")
        return torch.from_numpy(self._f[self.x_name][i]), int(self._f[self.y_name][i])


def _baseline_pass(path: str, batch: int, limit: int, x_name: str,
                   y_name: str) -> tuple[int, float]:
    from torch.utils.data import DataLoader, Dataset
    from torch.utils.data.distributed import DistributedSampler

    ds: Dataset[Any] = PerSampleDataset(path, x_name, y_name)  # type: ignore[assignment]
    sampler = DistributedSampler(ds, num_replicas=1, rank=0, shuffle=True, seed=0)
    loader = DataLoader(ds, batch_size=batch, sampler=sampler, num_workers=0)
    n = 0
    start = time.perf_counter()
    for x, _ in loader:
        n += len(x)
        if n >= limit:
            break
    return n, time.perf_counter() - start


def summarize(rounds: list[dict[str, Any]], dataset_bytes: int) -> dict[str, Any]:
    """Medians over rounds of the rates and of the within-round ratios, and the verdicts."""
    med = {k: common.median(r[k] for r in rounds) for k in ("raw", "reader", "baseline")}
    vs_raw = common.median(r["reader"] / r["raw"] for r in rounds)
    vs_base = common.median(r["reader"] / r["baseline"] for r in rounds)
    # Flat: after the first half of an epoch (windows and prefetch allocated), RSS
    # no longer grows as the rest of the file streams through.
    growth = max(r["rss_peak"] - r["rss_first_half"] for r in rounds)
    held = max(r["rss_peak"] - r["rss_before"] for r in rounds)
    anon_growth = max(r["anon_peak"] - r["anon_first_half"] for r in rounds)
    anon_held = max(r["anon_peak"] - r["anon_before"] for r in rounds)
    window = rounds[0]["window_bytes"]
    bound = 2 * window + rounds[0]["prefetch_bytes"] + 32 * MIB
    return {
        "samples_per_s": med,
        "reader_vs_raw": vs_raw,
        "reader_vs_baseline": vs_base,
        "window_bytes": window,
        "dataset_over_window": dataset_bytes / window,
        "rss_peak": max(r["rss_peak"] for r in rounds),
        "rss_growth_after_first_half": growth,
        "rss_held_by_reader": held,
        "rss_bound": bound,
        "anon_growth_after_first_half": anon_growth,
        "anon_held_by_reader": anon_held,
        "mapped": all(r.get("mapped", False) for r in rounds),
        "checks": {
            "reader >= 50% of raw": vs_raw >= 0.5,
            "reader >= 30x baseline": vs_base >= 30,
            "dataset >= 4x window": dataset_bytes >= 4 * window,
            "anonymous memory flat after the first half (growth <= 8 MiB)":
                anon_growth <= 8 * MIB,
            "rss does not grow with the file (growth after the first half <= 1 window)":
                growth <= window,
            "rss held <= 2 windows + prefetch + 32 MiB": held <= bound,
        },
    }


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hpcdp bench reader", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--file", help="an existing samples-first HDF5 file (default: make one)")
    p.add_argument("--samples", type=int, default=50_000, help="samples in the made file")
    p.add_argument("--shape", default="3,32,32", help="sample shape of the made file (uint8)")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--window", type=int, default=None, help="window samples per stream")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--baseline-samples", type=int, default=4096,
                   help="samples the (slow) per-sample baseline reads per round")
    p.add_argument("--x-name", default="x")
    p.add_argument("--y-name", default="y")
    p.add_argument("--out", default="bench/results/reader.json",
                   help="JSON file, or a folder to write reader.json into")
    p.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    return p


def _measure(args: argparse.Namespace, path: str) -> tuple[list[dict[str, Any]], int, int | None]:
    """(the rounds, the file's sample bytes, its chunk rows): raw, reader, baseline and
    memory, round by round, on the file at `path`."""
    import h5py

    with h5py.File(path, "r") as f:
        d = f[args.x_name]
        dataset_bytes = d.size * d.dtype.itemsize
        chunk_rows = d.chunks[0] if d.chunks else None
    _raw_pass(path, args.x_name)  # warm the page cache
    # torch and h5py only once a file exists: --help and bad arguments answer at once.
    import psutil

    from hpcdp.data.read.samples import ShardedReader

    before = _memory(psutil.Process())
    reader = ShardedReader(path, batch_size=args.batch, seed=1, window_samples=args.window,
                           x_name=args.x_name, y_name=args.y_name)
    # As in training, the reader stays open from epoch to epoch: one untimed epoch
    # first (the file opened, the window arrays allocated), then one per round.
    _warm_up(reader)
    rounds = []
    for i in range(args.rounds):
        n_raw, t_raw = _raw_pass(path, args.x_name)
        n_reader, t_reader = _reader_pass(reader, 2 * i + 1)
        n_base, t_base = _baseline_pass(path, args.batch, args.baseline_samples,
                                        args.x_name, args.y_name)
        mem = _memory_pass(reader, 2 * i + 2, before)
        rounds.append({**mem, "samples": n_reader, "seconds": t_reader,
                       "raw": n_raw / t_raw, "reader": n_reader / t_reader,
                       "baseline": n_base / t_base})
        print(f"round {i}: raw {rounds[-1]['raw']:.0f}/s  reader "
              f"{rounds[-1]['reader']:.0f}/s  baseline {rounds[-1]['baseline']:.0f}/s",
              flush=True)
    reader.close()
    return rounds, dataset_bytes, chunk_rows


def _print_summary(summary: dict[str, Any], dataset_bytes: int) -> None:
    med = summary["samples_per_s"]
    print()
    print(common.format_table(
        ["column", "samples/s (median)", "reader / column"],
        [["raw slab reads", med["raw"], summary["reader_vs_raw"]],
         ["sharded reader", med["reader"], 1.0],
         ["per-sample DataLoader", med["baseline"], summary["reader_vs_baseline"]]]))
    print(f"\nfile {dataset_bytes / MIB:.0f} MiB = {summary['dataset_over_window']:.1f} x the "
          f"reader's window ({summary['window_bytes'] / MIB:.1f} MiB); peak RSS "
          f"{summary['rss_peak'] / MIB:.0f} MiB; the reader holds "
          f"{summary['rss_held_by_reader'] / MIB:.0f} MiB, growth after the first half "
          f"of an epoch {summary['rss_growth_after_first_half'] / MIB:.1f} MiB; anonymous "
          f"memory held {summary['anon_held_by_reader'] / MIB:.0f} MiB, growth "
          f"{summary['anon_growth_after_first_half'] / MIB:.1f} MiB; batches "
          f"{'gathered from the mapped file' if summary['mapped'] else 'read through HDF5'}")
    for name, ok in summary["checks"].items():
        print(f"  [{'ok' if ok else 'MISSED'}] {name}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(build_parser(), argv)
    with tempfile.TemporaryDirectory(prefix="hpcdp-bench-reader-") as tmp:
        path = args.file
        if path is None:
            # A process of its own: preparation applies hpcdp's runtime settings to its
            # environment, which must not reach the benchmarks this process runs next.
            done = subprocess.run([sys.executable, "-m", "hpcdp.data.prep.cli", "synthetic",
                                   "--samples", str(args.samples), "--shape", args.shape,
                                   "--out", tmp], env=common.pythonpath_env())
            if done.returncode:
                return done.returncode
            path = str(Path(tmp) / "train.h5")
        rounds, dataset_bytes, chunk_rows = _measure(args, path)
    summary = summarize(rounds, dataset_bytes)
    _print_summary(summary, dataset_bytes)
    payload = {
        "benchmark": "reader",
        "config": {"file": args.file or f"synthetic {args.samples} x {args.shape} uint8",
                   "batch": args.batch, "chunk_rows": chunk_rows, "rounds": args.rounds,
                   "baseline_samples": args.baseline_samples,
                   "ru_maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                   "omp_num_threads": os.environ.get("OMP_NUM_THREADS")},
        "rounds": rounds,
        "summary": summary,
    }
    out = common.write_json(result_path(args.out, "reader"), payload)
    print(f"wrote {out}")
    return 1 if args.check and not all(summary["checks"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
