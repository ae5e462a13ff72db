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
import os
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from hpcdp.data.format import samples
from hpcdp.data.prep import frame
from hpcdp.data.prep.blocks import DEFAULT_BLOCK_BYTES, items_per_block, plan_items, rank_blocks
from hpcdp.data.prep.clicks import synth as ck
from hpcdp.data.prep.merge import root_attrs, write_parts
from hpcdp.data.prep.parts import Parts, fingerprint
from hpcdp.data.prep.progress import Progress
from hpcdp.data.prep.world import PrepError, allreduce, check_world
from hpcdp.data.prep.world import world as comm_world
from hpcdp.runtime.crash import report_crashes

PROG = "hpcdp prep clicks"
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
    return root_attrs(schema, n, "clicks", split, world.spec.params(), world.spec.seed, {
        "table_sizes": np.asarray(sizes, np.int64),
        "field_names": json.dumps(ck.field_names()),
        "dense_features": ck.DENSE_FEATURES,
        "offset": world.offset,
    })


def _create(f: Any, world: ck.ClickWorld, split: str, n: int, chunk: int,
            attrs: dict[str, Any]) -> dict[str, Any]:
    shapes = {"dense": ((ck.DENSE_FEATURES,), np.float32),
              "sparse": ((len(world.sizes),), np.int32), "label": ((), np.uint8)}
    dsets = {name: f.create_dataset(name, shape=(n, *tail), dtype=dtype, chunks=(chunk, *tail),
                                    fill_time="never")
             for name, (tail, dtype) in shapes.items()}
    for key, value in {**split_attrs(world, split, n), **attrs}.items():
        f.attrs[key] = value
    return dsets


def read_block(world: ck.ClickWorld, split: str, block: range) -> dict[str, np.ndarray]:
    """A block's rows as a part's arrays; validation parts keep the true probabilities and
    popularity, for the reference AUCs."""
    rows = world.rows(split, block.start, block.stop)
    extra = {"prob": rows.prob, "popularity": rows.popularity} if split == "val" else {}
    return {"dense": rows.dense, "sparse": rows.sparse, "label": rows.label, **extra}


def computed_attrs(split: str, n: int, parts: Parts, mine: range, n_blocks: int, comm: Any
                   ) -> dict[str, Any]:
    """Collective: the click rate (clicks summed over the ranks) and, for validation, the
    reference AUCs, computed on rank 0 alone from every part and broadcast."""
    clicks = allreduce(comm, sum(int(parts.load(split, i)["label"].sum()) for i in mine))
    attrs: dict[str, Any] = {"click_rate": clicks / n}
    if split == "val":
        aucs = None
        if comm.rank == 0:
            got = [parts.load(split, i) for i in range(n_blocks)]
            aucs = ck.reference_aucs(*(np.concatenate([g[k] for g in got])
                                       for k in ("label", "prob", "popularity")))
        attrs.update(comm.bcast(aucs, root=0))
    return attrs


def write_split(out: str, world: ck.ClickWorld, split: str, n: int, comm: Any, parts: Parts,
                chunk_bytes: int = samples.CHUNK_BYTES, collective: bool = False,
                block_bytes: int = DEFAULT_BLOCK_BYTES) -> str:
    """Collective: `split` as parts, then OUT/SPLIT.h5 from them (a temporary name renamed
    when complete); return the path."""
    final = os.path.join(out, f"{split}.h5")
    chunk = samples.chunk_rows(ROW_BYTES, n, chunk_bytes)
    blocks = plan_items(n, items_per_block(ROW_BYTES, block_bytes, n, unit=chunk))
    mine = rank_blocks(len(blocks), comm.rank, comm.size)
    frame.save_blocks(comm, PROG, parts, split, blocks, mine, "rows", "rows",
                      lambda i: read_block(world, split, blocks[i]))
    attrs = computed_attrs(split, n, parts, mine, len(blocks), comm)
    bar = Progress(comm, f"{split}: file", n, "rows", PROG)
    write_parts(final, parts, split, mine,
                lambda f, total: _create(f, world, split, total, chunk, attrs), comm,
                samples.slab_rows(chunk, ROW_BYTES), progress=bar, collective=collective)
    bar.close()
    return final


def build_parser() -> argparse.ArgumentParser:
    d = ck.ClickSpec()
    p = argparse.ArgumentParser(
        prog="hpcdp prep clicks",
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
    frame.add_common_options(p)
    return p


def spec_from(args: argparse.Namespace) -> ck.ClickSpec:
    return ck.ClickSpec(rows=args.rows, val_rows=args.val_rows, seed=args.seed, users=args.users,
                        items=args.items, min_table=args.min_table, max_table=args.max_table,
                        latent_dim=args.latent_dim, zipf=args.zipf, click_rate=args.click_rate)


def _check(args: argparse.Namespace, comm: Any) -> tuple[ck.ClickSpec, dict[str, int]]:
    """Every check of the options, on this rank; the spec and the splits' rows."""
    check_world(comm.size)
    spec = spec_from(args).check()
    splits = split_rows(spec)
    if args.chunk_mib <= 0:
        raise PrepError(f"--chunk-mib must be positive, got {args.chunk_mib}")
    frame.block_bytes(args.block_mib)
    frame.check_outputs(args.out, [f"{name}.h5" for name in splits], args.overwrite,
                        refusal="{first} exists; pass --overwrite to replace it (nothing "
                                "was written)", resume=args.resume)
    return spec, splits


def _write(args: argparse.Namespace, spec: ck.ClickSpec, splits: dict[str, int], comm: Any
           ) -> list[str]:
    world = ck.ClickWorld(spec).calibrate()
    options = fingerprint(spec.params(),
                          {"chunk_mib": args.chunk_mib, "block_mib": args.block_mib})
    with Parts(args.out, "clicks", options, comm, args.resume) as parts:
        return [write_split(args.out, world, name, n, comm, parts, int(args.chunk_mib * 2**20),
                            args.mpio == "collective", frame.block_bytes(args.block_mib))
                for name, n in splits.items()]


def main(argv: Sequence[str] | None = None) -> int:
    report_crashes()
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    comm = comm_world()
    return frame.run(
        PROG, comm, lambda: _check(args, comm), lambda got: _write(args, *got, comm),
        lambda written, seconds: _summary(written, seconds, comm.size),
        bad_input=(ck.ClickSpecError, PrepError, OSError, ImportError),
        stall_s=args.stall_timeout)


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
