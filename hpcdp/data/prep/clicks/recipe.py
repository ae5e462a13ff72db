"""Write the synthetic click log (`hpcdp.data.prep.clicks.synth`) as OUT/train.h5 and OUT/val.h5.

Run on one process, or under ``mpirun -np N`` / ``srun --mpi=pmix``: every rank
generates and writes its own chunk-aligned slab of each file through parallel
HDF5, as `hpcdp.data.prep.cli` does for samples. Each file holds three row-aligned
datasets, chunked alike (the same rows per chunk, so that a reader's whole-chunk
reads line up across them):

- ``dense``  (N, 13) float32: dense features;
- ``sparse`` (N, 26) int32: one id per categorical field, in [0, table size);
- ``label``  (N,) uint8: 1 for a click, else 0;

and as attributes: ``table_sizes`` (rows of each field's table, so that a model
can be built from the data), ``field_names``, ``dense_features``, ``click_rate``
(of the drawn labels), ``offset`` (the solved c), ``schema``, ``source_params``
and, on the validation file, ``oracle_auc`` and ``baseline_auc``.

An existing output is never replaced unless ``--overwrite`` is given; bad options
are agreed on by every rank before any collective file operation.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from hpcdp import __version__
from hpcdp.data.format import samples
from hpcdp.data.prep import frame as prep_run
from hpcdp.data.prep.clicks import synth as ck
from hpcdp.runtime.crash import report_crashes

PROG = "clicks"
FIELDS = ("dense", "sparse", "label")
#: Bytes of one row over the three datasets.
ROW_BYTES = ck.DENSE_FEATURES * 4 + len(ck.field_names()) * 4 + 1


def split_rows(spec: ck.ClickSpec) -> dict[str, int]:
    """The splits to write and their rows (a split of 0 rows is not written)."""
    rows = {"train": spec.rows, "val": spec.val_rows}
    return {name: n for name, n in rows.items() if n > 0}


def split_attrs(world: ck.ClickWorld, split: str, n: int) -> dict[str, Any]:
    """Attributes known before any row is written."""
    sizes = world.sizes
    schema = {"dense": {"shape": [n, ck.DENSE_FEATURES], "dtype": "float32"},
              "sparse": {"shape": [n, len(sizes)], "dtype": "int32"},
              "label": {"shape": [n], "dtype": "uint8"}}
    return {
        "schema": json.dumps(schema),
        "num_samples": n,
        "source": "clicks",
        "split": split,
        "seed": world.spec.seed,
        "source_params": json.dumps(world.spec.params(), sort_keys=True),
        "hpcdp_version": __version__,
        "table_sizes": np.asarray(sizes, np.int64),
        "field_names": json.dumps(ck.field_names()),
        "dense_features": ck.DENSE_FEATURES,
        "offset": world.offset,
    }


class _Tally:
    """What a rank saw of its rows, for the attributes computed after writing."""

    def __init__(self, keep: bool) -> None:
        self.clicks = 0
        self.keep = keep
        self.parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []

    def add(self, rows: ck.Rows) -> None:
        self.clicks += int(rows.label.sum())
        if self.keep:
            self.parts.append((rows.label, rows.prob, rows.popularity))

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if not self.parts:
            return np.zeros(0, np.uint8), np.zeros(0), np.zeros(0)
        return tuple(np.concatenate(a) for a in zip(*self.parts))  # type: ignore[return-value]


def _create(f: Any, world: ck.ClickWorld, split: str, n: int, chunk: int) -> list[Any]:
    shapes = {"dense": ((ck.DENSE_FEATURES,), np.float32),
              "sparse": ((len(world.sizes),), np.int32), "label": ((), np.uint8)}
    dsets = [f.create_dataset(name, shape=(n, *tail), dtype=dtype, chunks=(chunk, *tail),
                              fill_time="never")
             for name, (tail, dtype) in shapes.items()]
    for key, value in split_attrs(world, split, n).items():
        f.attrs[key] = value
    return dsets


def _write_rows(dsets: list[Any], start: int, rows: ck.Rows, comm: Any, collective: bool) -> None:
    for dset, data in zip(dsets, (rows.dense, rows.sparse, rows.label)):
        if comm.size == 1:
            if len(data):
                dset[start : start + len(data)] = data
        else:
            prep_run.mpio_write(dset, start, data, collective)


def _final_attrs(f: Any, tally: _Tally, n: int, comm: Any) -> None:
    """Click rate and (with `tally.keep`) the reference AUCs: gathered, same on every rank."""
    clicks = sum(comm.allgather(tally.clicks))
    f.attrs["click_rate"] = clicks / n
    if tally.keep:
        parts = comm.allgather(tally.arrays())
        label, prob, pop = (np.concatenate(a) for a in zip(*parts))
        aucs = comm.bcast(ck.reference_aucs(label, prob, pop) if comm.rank == 0 else None)
        for key, value in aucs.items():
            f.attrs[key] = value


def write_split(out: str, world: ck.ClickWorld, split: str, n: int, comm: Any,
                chunk_bytes: int = samples.CHUNK_BYTES, collective: bool = False) -> str:
    """Write `split` to OUT/SPLIT.h5 under a temporary name, then rename it; return the path."""
    final = os.path.join(out, f"{split}.h5")
    chunk = samples.chunk_rows(ROW_BYTES, n, chunk_bytes)
    slab = samples.slab_rows(chunk, ROW_BYTES)
    tally = _Tally(keep=split == "val")
    with prep_run.replacing(final, comm) as tmp, prep_run.create_h5(tmp, comm) as f:
        dsets = _create(f, world, split, n, chunk)
        for a, b in samples.rank_slabs(n, chunk, slab, comm.rank, comm.size):
            rows = world.rows(split, a, b)
            tally.add(rows)
            _write_rows(dsets, a, rows, comm, collective)
        _final_attrs(f, tally, n, comm)
    return final


def build_parser() -> argparse.ArgumentParser:
    d = ck.ClickSpec()
    p = argparse.ArgumentParser(
        prog="datasets/clicks.py",
        description="Write a synthetic click log with a planted signal as chunked HDF5.")
    p.add_argument("--out", required=True, help="output folder (train.h5, val.h5)")
    p.add_argument("--rows", type=int, default=d.rows, help="training rows")
    p.add_argument("--val-rows", type=int, default=d.val_rows, help="validation rows (0: none)")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--users", type=int, default=d.users, help="rows of the user table")
    p.add_argument("--items", type=int, default=d.items, help="rows of the item table")
    p.add_argument("--min-table", type=int, default=d.min_table,
                   help="smallest side/context table")
    p.add_argument("--max-table", type=int, default=d.max_table,
                   help="largest side/context table (up to 10**6 and more)")
    p.add_argument("--latent-dim", type=int, default=d.latent_dim,
                   help="dimension of the hidden user and item factors")
    p.add_argument("--zipf", type=float, default=d.zipf, help="popularity exponent")
    p.add_argument("--click-rate", type=float, default=d.click_rate)
    p.add_argument("--chunk-mib", type=float, default=samples.CHUNK_BYTES / 2**20,
                   help="target chunk size in MiB over the three datasets")
    p.add_argument("--mpio", choices=("independent", "collective"), default="independent")
    p.add_argument("--overwrite", action="store_true", help="replace existing outputs")
    return p


def spec_from(args: argparse.Namespace) -> ck.ClickSpec:
    return ck.ClickSpec(rows=args.rows, val_rows=args.val_rows, seed=args.seed, users=args.users,
                        items=args.items, min_table=args.min_table, max_table=args.max_table,
                        latent_dim=args.latent_dim, zipf=args.zipf, click_rate=args.click_rate)


def _check(args: argparse.Namespace, comm: Any) -> tuple[ck.ClickSpec, dict[str, int]]:
    """Every check of the options, on this rank; the spec and the splits' rows."""
    prep_run.check_world(comm.size)
    spec = spec_from(args).check()
    splits = split_rows(spec)
    if args.chunk_mib <= 0:
        raise prep_run.PrepError(f"--chunk-mib must be positive, got {args.chunk_mib}")
    prep_run.check_outputs(args.out, [f"{name}.h5" for name in splits], args.overwrite,
                           refusal="{first} exists; pass --overwrite to replace it (nothing "
                                   "was written)")
    return spec, splits


def _write(args: argparse.Namespace, spec: ck.ClickSpec, splits: dict[str, int], comm: Any
           ) -> list[str]:
    world = ck.ClickWorld(spec).calibrate()
    return [write_split(args.out, world, name, n, comm, int(args.chunk_mib * 2**20),
                        args.mpio == "collective") for name, n in splits.items()]


def main(argv: Sequence[str] | None = None) -> int:
    report_crashes()
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    comm = prep_run.world()
    return prep_run.run(
        PROG, comm, lambda: _check(args, comm), lambda got: _write(args, *got, comm),
        lambda written, seconds: _summary(written, seconds, comm.size),
        bad_input=(ck.ClickSpecError, prep_run.PrepError, OSError, ImportError))


def _summary(paths: list[str], seconds: float, ranks: int) -> None:
    import h5py

    for path in paths:
        with h5py.File(path, "r") as f:
            a = dict(f.attrs)
        extra = "".join(f", {k} {a[k]:.4f}" for k in ("oracle_auc", "baseline_auc") if k in a)
        print(f"{PROG}: wrote {path}: {a['num_samples']} rows, click rate "
              f"{a['click_rate']:.3f}{extra}", flush=True)
    print(f"{PROG}: {seconds:.2f} s on {ranks} rank(s)", flush=True)


if __name__ == "__main__":
    sys.exit(main())
