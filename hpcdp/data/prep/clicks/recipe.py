"""Write the synthetic click log (`hpcdp.data.prep.clicks.synth`) as OUT/train.h5 and OUT/val.h5.

Run on one process, or under ``mpirun -np N`` / ``srun --mpi=pmix``, in the frame of
`hpcdp.data.prep.frame` (docs/prep.md): every rank generates its blocks of whole chunks
as parts, then all write each file from the parts through parallel HDF5; the
validation AUCs are computed on rank 0 alone from the parts. Each file holds three
row-aligned
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
are agreed on by every rank before any collective file operation; a stopped run
continues with ``--resume``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hpcdp.data.format import samples
from hpcdp.data.prep import frame
from hpcdp.data.prep.blocks import items_per_block, plan_items
from hpcdp.data.prep.clicks import synth as ck
from hpcdp.data.prep.merge import root_attrs
from hpcdp.data.prep.recipe import SAME_BYTES, Recipe, Split
from hpcdp.data.prep.world import PrepError, allreduce

PROG = "hpcdp prep clicks"
#: Bytes of one row over the three datasets.
ROW_BYTES = ck.DENSE_FEATURES * 4 + len(ck.field_names()) * 4 + 1


@dataclass(frozen=True)
class Inputs:
    """The checked options: the log's spec, the chunk and block sizes (what a resumed run
    must share) and the MPI-IO transfer mode (which changes no byte)."""

    spec: ck.ClickSpec
    chunk_bytes: int
    block_bytes: int
    collective: bool = field(default=False, metadata=SAME_BYTES)


def _options(p: argparse.ArgumentParser) -> None:
    d = ck.ClickSpec()
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


def check(args: argparse.Namespace, comm: Any) -> Inputs:
    """Every check of the options, on this rank."""
    spec = ck.ClickSpec(rows=args.rows, val_rows=args.val_rows, seed=args.seed,
                        users=args.users, items=args.items, min_table=args.min_table,
                        max_table=args.max_table, latent_dim=args.latent_dim, zipf=args.zipf,
                        click_rate=args.click_rate).check()
    if args.chunk_mib <= 0:
        raise PrepError(f"--chunk-mib must be positive, got {args.chunk_mib}")
    return Inputs(spec, int(args.chunk_mib * 2**20), frame.block_bytes(args.block_mib),
                  args.mpio == "collective")


def split_rows(spec: ck.ClickSpec) -> dict[str, int]:
    """The splits to write and their rows (a split of 0 rows is not written)."""
    rows = {"train": spec.rows, "val": spec.val_rows}
    return {name: n for name, n in rows.items() if n > 0}


def splits(inputs: Inputs) -> list[Split]:
    """Each split in blocks of whole chunks; its `source`: the calibrated log and the rows."""
    world = ck.ClickWorld(inputs.spec).calibrate()
    out = []
    for name, n in split_rows(inputs.spec).items():
        chunk = samples.chunk_rows(ROW_BYTES, n, inputs.chunk_bytes)
        blocks = plan_items(n, items_per_block(ROW_BYTES, inputs.block_bytes, n, unit=chunk))
        out.append(Split(name, blocks, "rows", "rows", samples.slab_rows(chunk, ROW_BYTES),
                         "rows", collective=inputs.collective, source=(world, chunk)))
    return out


def read_block(inputs: Inputs, split: Split, block: range) -> dict[str, np.ndarray]:
    """A block's rows as a part's arrays; validation parts keep the true probabilities and
    popularity, for the reference AUCs."""
    rows = split.source[0].rows(split.name, block.start, block.stop)
    extra = {"prob": rows.prob, "popularity": rows.popularity} if split.name == "val" else {}
    return {"dense": rows.dense, "sparse": rows.sparse, "label": rows.label, **extra}


def computed_attrs(inputs: Inputs, split: Split, parts: Any, mine: range, comm: Any
                   ) -> dict[str, Any]:
    """Collective: the click rate (clicks summed over the ranks) and, for validation, the
    reference AUCs, computed on rank 0 alone from every part and broadcast."""
    n = split.blocks[-1].stop
    clicks = allreduce(comm, sum(int(parts.load(split.name, i)["label"].sum()) for i in mine))
    attrs: dict[str, Any] = {"click_rate": clicks / n}
    if split.name == "val":
        aucs = None
        if comm.rank == 0:
            got = [parts.load(split.name, i) for i in range(len(split.blocks))]
            aucs = ck.reference_aucs(*(np.concatenate([g[k] for g in got])
                                       for k in ("label", "prob", "popularity")))
        attrs.update(comm.bcast(aucs, root=0))
    return attrs


def datasets(inputs: Inputs, split: Split, f: Any, totals: dict[str, int], computed: Any
             ) -> dict[str, Any]:
    world, chunk = split.source
    shapes = {"dense": ((ck.DENSE_FEATURES,), np.float32),
              "sparse": ((len(world.sizes),), np.int32), "label": ((), np.uint8)}
    n = totals["dense"]
    return {name: f.create_dataset(name, shape=(n, *tail), dtype=dtype, chunks=(chunk, *tail),
                                   fill_time="never")
            for name, (tail, dtype) in shapes.items()}


def attributes(inputs: Inputs, split: Split, totals: dict[str, int],
               computed: dict[str, Any]) -> dict[str, Any]:
    """What a model is built from (the table sizes), and the computed click rate and AUCs."""
    world, n = split.source[0], totals["dense"]
    schema = {"dense": {"shape": [n, ck.DENSE_FEATURES], "dtype": "float32"},
              "sparse": {"shape": [n, len(world.sizes)], "dtype": "int32"},
              "label": {"shape": [n], "dtype": "uint8"}}
    return {**root_attrs(schema, n, "clicks", split.name, world.spec.params(), world.spec.seed,
                         {"table_sizes": np.asarray(world.sizes, np.int64),
                          "field_names": json.dumps(ck.field_names()),
                          "dense_features": ck.DENSE_FEATURES, "offset": world.offset}),
            **computed}


def summary(inputs: Inputs, paths: list[str], seconds: float, ranks: int) -> None:
    import h5py

    for path in paths:
        with h5py.File(path, "r") as f:
            a = dict(f.attrs)
        extra = "".join(f", {k} {a[k]:.4f}" for k in ("oracle_auc", "baseline_auc") if k in a)
        print(f"{PROG}: wrote {path}: {a['num_samples']} rows, click rate "
              f"{a['click_rate']:.3f}{extra}", flush=True)
    print(f"{PROG}: {seconds:.2f} s on {ranks} rank(s)", flush=True)


RECIPE = Recipe(
    "clicks", "a synthetic click log with a planted signal -> train.h5, val.h5", _options,
    check, lambda inputs: [f"{name}.h5" for name in split_rows(inputs.spec)], splits,
    read_block, datasets, summary, attributes, computed_attrs, prog=PROG,
    description="Write a synthetic click log with a planted signal as chunked HDF5.",
    refusal="{first} exists; pass --overwrite to replace it (nothing was written)",
    bad_input=(ck.ClickSpecError, PrepError, OSError, ImportError))


def main(argv: Sequence[str] | None = None) -> int:
    return frame.main(RECIPE, argv)


if __name__ == "__main__":
    sys.exit(main())
