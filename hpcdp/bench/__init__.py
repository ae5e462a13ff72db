"""`hpcdp bench <what>`: each benchmark is a module here with `main(argv) -> int`."""

from __future__ import annotations

import importlib
import sys

BENCHMARKS: dict[str, str] = {
    "allreduce": "all-reduce bandwidth: Horovod (MPI, Gloo) vs raw mpi4py vs memcpy",
    "fusion": "tensor fusion on/off for many small asynchronous all-reduces",
    "reader": "sharded HDF5 reader vs raw slab reads vs a per-sample DataLoader",
    "prep": "parallel dataset preparation, 1 rank vs 2 ranks",
    "train": "weak scaling of real training, 1 vs 2 ranks, step-time split",
}


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print("usage: hpcdp bench <what> [options]\n\nbenchmarks:")
        for name, help_ in BENCHMARKS.items():
            print(f"  {name:<10} {help_}")
        return 0
    name = args[0]
    if name not in BENCHMARKS:
        print(
            f"hpcdp bench: unknown benchmark {name!r}; choose from {', '.join(BENCHMARKS)}",
            file=sys.stderr,
        )
        return 2
    module = importlib.import_module(f"hpcdp.bench.{name}")
    return int(module.main(args[1:]) or 0)
