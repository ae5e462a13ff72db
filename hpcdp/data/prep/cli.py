"""`hpcdp prep RECIPE --out DIR`: every recipe's command; the sample sources' recipes here.

`arrays`, `digits`, `cifar` and `synthetic` are sources of fixed-shape samples
(`hpcdp.data.prep.arrays`), run here; the other recipes (`RECIPES`) have modules of their
own, to which `main` hands the command line. All run in the frame of
`hpcdp.data.prep.frame` (docs/prep.md): blocks of whole chunks saved as parts by the
ranks, then ONE file per split written from them through parallel HDF5 (driver
``mpio``). File creation, dataset creation, attributes and close are collective; every
rank makes the same number of data writes (some empty). The data transfer is independent
MPI-IO by default: each block is contiguous, and collective two-phase I/O made 2 ranks on
a shared 2-core machine about 1.8x slower than 1 (ranks wait for each other every
round); ``--mpio collective`` switches it on for file systems where aggregation pays.
With compression, rank 0 writes alone: parallel HDF5 1.10 cannot reliably write filtered
datasets through MPI-IO.

Each file is written under a temporary name and renamed when complete, so a
failed run never clobbers an existing good file; a file already there is
replaced only with ``--overwrite``. Bad input (that refusal included) is
detected on every rank and agreed on (an all-gather of errors) before any
collective file operation, so every rank prints the problem and exits 2 with
nothing written. A stopped run continues with ``--resume``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hpcdp.cliargs import parse_args
from hpcdp.data.format.samples import CHUNK_BYTES, chunk_rows, label_chunk_rows, slab_rows
from hpcdp.data.prep import arrays as src
from hpcdp.data.prep import frame
from hpcdp.data.prep.blocks import DEFAULT_BLOCK_BYTES, items_per_block, plan_items, rank_blocks
from hpcdp.data.prep.frame import EXIT_BAD_INPUT, EXIT_WRITE_FAILED, write_or_abort
from hpcdp.data.prep.images import cifar
from hpcdp.data.prep.merge import root_attrs, write_parts
from hpcdp.data.prep.parts import SAME_BYTES, Parts, fingerprint
from hpcdp.data.prep.progress import Progress
from hpcdp.data.prep.world import PrepError, agree, check_world, say, world
from hpcdp.runtime.crash import report_crashes

COMPRESSIONS = ("none", "gzip", "lzf")
PROG = "hpcdp prep"


def file_attrs(source: src.Source, source_name: str, seed: int, x_name: str,
               y_name: str | None) -> dict[str, Any]:
    """Root attributes: what is in the file and how it was made."""
    schema = {x_name: {"shape": [source.num_samples, *source.sample_shape],
                       "dtype": str(source.dtype)}}
    if y_name and source.has_labels:
        schema[y_name] = {"shape": [source.num_samples], "dtype": "int64"}
    return root_attrs(schema, source.num_samples, source_name, source.name,
                      source.params, seed, source.attrs)


# -- writing ------------------------------------------------------------------------


@dataclass(frozen=True)
class WriteOptions:
    x_name: str = "x"
    y_name: str | None = "y"
    compression: str = "none"
    chunk_bytes: int = CHUNK_BYTES
    seed: int = 0
    source_name: str = ""
    collective: bool = field(default=False, metadata=SAME_BYTES)
    block_bytes: int = DEFAULT_BLOCK_BYTES


def _create(f: Any, source: src.Source, opts: WriteOptions, chunk: int) -> dict[str, Any]:
    """The datasets (by their part names, x and y) and attributes of a new file."""
    comp: dict[str, Any] = {}
    if opts.compression != "none":
        comp = {"compression": opts.compression, "shuffle": opts.compression == "gzip"}
    dsets = {"x": f.create_dataset(
        opts.x_name, shape=(source.num_samples, *source.sample_shape), dtype=source.dtype,
        chunks=(chunk, *source.sample_shape), fill_time="never", **comp)}
    if opts.y_name and source.has_labels:
        dsets["y"] = f.create_dataset(
            opts.y_name, shape=(source.num_samples,), dtype=np.int64,
            chunks=(label_chunk_rows(chunk, source.num_samples),), fill_time="never", **comp)
    for key, value in file_attrs(source, opts.source_name, opts.seed, opts.x_name,
                                 opts.y_name).items():
        f.attrs[key] = value
    return dsets


def read_block(source: src.Source, block: range, opts: WriteOptions) -> dict[str, np.ndarray]:
    """A block's samples (and labels) as a part's arrays."""
    xs, ys = source.slab(block.start, block.stop)
    return {"x": xs, **({"y": ys} if opts.y_name and source.has_labels else {})}


def write_split(out_dir: str, source: src.Source, opts: WriteOptions, comm: Any,
                parts: Parts) -> str:
    """Collective: one split to ``out_dir/NAME.h5``: this rank's blocks as parts, then the
    file from every rank's parts (under a temporary name); return the final path."""
    final = os.path.join(out_dir, f"{source.name}.h5")
    chunk = chunk_rows(source.sample_bytes, source.num_samples, opts.chunk_bytes)
    # whole chunks a block, so that no two ranks write into one chunk
    blocks = plan_items(source.num_samples, items_per_block(
        source.sample_bytes, opts.block_bytes, source.num_samples, unit=chunk))
    mine = rank_blocks(len(blocks), comm.rank, comm.size)
    frame.save_blocks(comm, PROG, parts, source.name, blocks, mine, "samples", "samples",
                      lambda i: read_block(source, blocks[i], opts))
    bar = Progress(comm, f"{source.name}: file", source.num_samples, "samples", PROG)
    write_parts(final, parts, source.name, mine,
                lambda f, n: _create(f, source, opts, chunk), comm,
                slab_rows(chunk, source.sample_bytes),
                serial=opts.compression != "none", progress=bar,
                collective=opts.collective)
    bar.close()
    return final


# -- command line ---------------------------------------------------------------------


EXIT_STATUS = ("Exit status: 0 written; 2 bad input, an existing output file without "
               "--overwrite or an unfinished run's OUT/.hpcdp-prep without --resume (nothing "
               "written); 1 a failure while writing (old files kept; --resume continues).")


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--out", required=True,
                        help="output folder (one NAME.h5 per split); a NAME.h5 already there "
                             "is an error unless --overwrite")
    common.add_argument("--overwrite", action="store_true",
                        help="replace NAME.h5 files already in --out (each new file is written "
                             "under a temporary name and renamed over the old one only when "
                             "complete)")
    common.add_argument("--seed", type=int, default=0, help="seed of the data and the split")
    common.add_argument("--x-name", default="x", help="dataset name of the samples")
    common.add_argument("--y-name", default="y", help="dataset name of the labels")
    common.add_argument("--compression", choices=COMPRESSIONS, default="none",
                        help="filter for both datasets; with several ranks rank 0 writes alone")
    common.add_argument("--chunk-mib", type=float, default=CHUNK_BYTES / 2**20,
                        help="target chunk size in MiB (chunks run along the sample axis)")
    common.add_argument("--mpio", choices=("independent", "collective"), default="independent",
                        help="MPI-IO transfer of the data slabs with several ranks (default: "
                             "independent; every rank writes its own contiguous slab)")
    common.add_argument("--report", help="rank 0 writes timing and sizes as JSON here "
                                          "(replaced if it exists, like benchmark results)")
    frame.add_common_options(common)
    parser = argparse.ArgumentParser(
        prog="hpcdp prep", description="Prepare a dataset as chunked HDF5, on one process or "
        "under mpirun / srun: 'hpcdp prep RECIPE --help' for a recipe's options.",
        epilog=EXIT_STATUS)
    sub = parser.add_subparsers(dest="source", required=True, metavar="RECIPE")
    p = sub.add_parser("digits", parents=[common], epilog=EXIT_STATUS,
                       help="scikit-learn's bundled 8x8 digits -> train.h5, val.h5 (uint8)")
    p.add_argument("--val-fraction", type=float, default=0.2)
    p = sub.add_parser("synthetic", parents=[common], epilog=EXIT_STATUS,
                       help="seeded random samples of any shape")
    p.add_argument("--samples", type=int, required=True)
    p.add_argument("--shape", default="3,32,32", help="sample shape, e.g. 3,32,32")
    p.add_argument("--dtype", default="uint8")
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--val-samples", type=int, default=0, help="also write val.h5 with this many")
    p = sub.add_parser("arrays", parents=[common], epilog=EXIT_STATUS,
                       help="your .npy/.npz arrays, memory-mapped (never loaded whole)")
    p.add_argument("--x", required=True, dest="x_path", help="samples: .npy or .npz")
    p.add_argument("--y", dest="y_path", help="labels: .npy or .npz (default: none, or the "
                                              "--y-key member of the --x .npz)")
    p.add_argument("--x-key", default="x", help="member name inside a .npz")
    p.add_argument("--y-key", default="y", help="member name inside a .npz ('' for none)")
    p.add_argument("--split", default="train", help="output name: SPLIT.h5")
    p = sub.add_parser("cifar", parents=[common], epilog=EXIT_STATUS,
                       help="a CIFAR-10/100 archive (binary or python version) -> train.h5, "
                            "val.h5 (uint8 3x32x32, class names, channel mean/std)")
    p.add_argument("--archive", required=True, help="the .tar.gz as published")
    p.add_argument("--labels", choices=("fine", "coarse"), default="fine",
                   help="CIFAR-100: which label becomes y (CIFAR-10 has one)")
    for name, (_, help_) in RECIPES.items():  # listed here, parsed by their own modules
        sub.add_parser(name, help=help_, add_help=False)
    return parser


#: The recipes with a module of their own: `hpcdp prep NAME ...` runs ``module.main``.
RECIPES: dict[str, tuple[str, str]] = {
    "markov": ("hpcdp.data.prep.text.markov_recipe",
               "documents from a seeded Markov chain -> token files (entropy rate known)"),
    "clicks": ("hpcdp.data.prep.clicks.recipe",
               "a synthetic click log with a planted signal -> train.h5, val.h5"),
    "images": ("hpcdp.data.prep.images.recipe",
               "an image folder (one subfolder per class) -> uint8 samples"),
    "text": ("hpcdp.data.prep.text.recipe",
             "text, JSON Lines or Parquet corpora -> token files (bytes, BPE, tokenizer.json)"),
    "criteo": ("hpcdp.data.prep.clicks.criteo_recipe",
               "Criteo click logs (plain or .gz) -> train.h5, val.h5 for the recsys task"),
}


def source_options(args: argparse.Namespace) -> dict[str, Any]:
    """The options the recipe's splits are made from, by name: `make_sources` reads these
    (and the seed) and nothing else, so with the writer's options and the input files they
    are what a resumed run must share with the run it continues."""
    if args.source == "digits":
        return {"val_fraction": args.val_fraction}
    if args.source == "synthetic":
        return {"samples": args.samples, "shape": args.shape, "dtype": args.dtype,
                "classes": args.classes, "val_samples": args.val_samples}
    if args.source == "cifar":
        return {"archive": args.archive, "labels": args.labels}
    return {"x_path": args.x_path, "y_path": args.y_path, "x_key": args.x_key,
            "y_key": args.y_key, "split": args.split}


#: The `source_options` that name input files.
INPUT_FILES = ("x_path", "y_path", "archive")


def make_sources(recipe: str, made_from: dict[str, Any], seed: int) -> list[src.Source]:
    """The splits of `recipe` from its `source_options`; `SourceError` on bad options or
    input files."""
    if not 0 <= seed < 2**63:
        raise src.SourceError(f"--seed must be in [0, 2**63), got {seed}")
    o = made_from
    if recipe == "digits":
        return src.digits(seed, o["val_fraction"])
    if recipe == "synthetic":
        if o["val_samples"] < 0:
            raise src.SourceError(f"--val-samples must be non-negative, got {o['val_samples']}")
        return src.synthetic(o["samples"], src.parse_shape(o["shape"]), o["dtype"],
                             o["classes"], seed, o["val_samples"])
    if recipe == "cifar":
        return cifar.cifar(o["archive"], o["labels"])
    check_name("--split", o["split"])
    return src.arrays(o["x_path"], o["y_path"], o["x_key"], o["y_key"] or None, o["split"])


def check_name(flag: str, name: str) -> None:
    """A dataset or split name: one plain name (no path, no NUL, valid UTF-8 for HDF5)."""
    plain = bool(name) and name not in (".", "..") and name == name.strip()
    if not plain or "/" in name or "\0" in name or not name.isprintable():
        raise PrepError(f"{flag} {name!r}: expected a plain name like 'train' or 'x' "
                        "(not empty, no '/', no control characters or surrounding spaces)")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise PrepError(f"{flag} {name!r}: not valid UTF-8 text") from None


def write_options(args: argparse.Namespace) -> WriteOptions:
    """The writer's options from the command line; `PrepError` names a bad one."""
    if not (math.isfinite(args.chunk_mib) and 0 < args.chunk_mib * 2**20 <= src.MAX_SAMPLE_BYTES):
        raise PrepError(f"--chunk-mib {args.chunk_mib}: expected a size in MiB above 0 and "
                        "below 4096 (HDF5's chunk limit)")
    check_name("--x-name", args.x_name)
    if args.y_name:
        check_name("--y-name", args.y_name)
    if args.x_name == args.y_name:
        raise PrepError(f"--x-name and --y-name are both {args.x_name!r}")
    return WriteOptions(x_name=args.x_name, y_name=args.y_name or None,
                        compression=args.compression,
                        chunk_bytes=max(1, int(args.chunk_mib * 2**20)), seed=args.seed,
                        source_name=args.source, collective=args.mpio == "collective",
                        block_bytes=frame.block_bytes(args.block_mib))


def _existing_parent(path: str) -> str:
    """The nearest folder above `path` that exists (where a new folder would be made)."""
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    return parent


def check_out(out: str, sources: Sequence[src.Source], overwrite: bool,
              resume: bool = False) -> None:
    """Refuse an output folder that cannot hold the splits, or whose files would be lost
    (files a resumed run renamed into place before it was stopped are its own).

    Creates nothing: the folder is made only after every rank agreed on the input.
    """
    if not out or "\0" in out:
        raise PrepError(f"--out {out!r}: expected a folder path")
    if os.path.exists(out) and not os.path.isdir(out):
        raise PrepError(f"--out {out}: exists and is not a folder")
    where = out if os.path.isdir(out) else _existing_parent(out)
    if not os.path.isdir(where):
        raise PrepError(f"--out {out}: {where} is not a folder")
    if not os.access(where, os.W_OK | os.X_OK):
        raise PrepError(f"--out {out}: {where} is not writable")
    for source in sources:
        final = os.path.join(out, f"{source.name}.h5")
        if os.path.isdir(final):
            raise PrepError(f"{final} is a folder; a dataset cannot replace it")
        if os.path.lexists(final) and not overwrite and not frame.resuming(out, resume):
            raise PrepError(f"{final} already exists; pass --overwrite to replace it "
                            "(the old file stays until the new one is complete)")


def check_space(out: str, sources: Sequence[src.Source], compression: str) -> None:
    """Uncompressed output must fit the free space twice (the parts, then the files): fail
    now, not hours into the write."""
    if compression != "none":
        return
    need = 2 * sum(s.num_samples * (s.sample_bytes + 8) for s in sources)
    where = out if os.path.isdir(out) else _existing_parent(out)
    free = shutil.disk_usage(where).free
    if need > free:
        samples = sum(s.num_samples for s in sources)
        raise PrepError(f"--out {out}: {samples} samples of {sources[0].sample_bytes} bytes need "
                        f"{need / 2**30:.2f} GiB, but {where} has {free / 2**30:.2f} GiB free")


def check_report(report: str | None) -> None:
    if report is None:
        return
    folder = os.path.dirname(os.path.abspath(report))
    if not report or os.path.isdir(report) or not os.path.isdir(folder):
        raise PrepError(f"--report {report!r}: expected a file path in an existing folder")


@dataclass(frozen=True)
class Inputs:
    """The checked options: the writer's, what the splits are made from, and the splits."""

    opts: WriteOptions
    made_from: dict[str, Any]
    sources: list[src.Source]

    def fingerprint(self) -> dict[str, Any]:
        """What changes the parts or the files: the writer's options, what the splits are
        made from, and the input files (not the splits, which follow from those)."""
        files = [self.made_from[k] for k in INPUT_FILES if self.made_from.get(k)]
        return fingerprint(self.opts, self.made_from, files=files)


def prepare_inputs(args: argparse.Namespace, comm: Any) -> Inputs:
    """Every check of the options and input files, on this rank; raises on bad input."""
    check_world(comm.size)
    opts = write_options(args)
    made_from = source_options(args)
    sources = make_sources(args.source, made_from, opts.seed)
    for source in sources:
        src.check_sample_bytes(source.sample_shape, source.dtype, f"split {source.name}")
    check_out(args.out, sources, args.overwrite, args.resume)
    check_space(args.out, sources, opts.compression)
    check_report(args.report)
    return Inputs(opts, made_from, sources)


def agreed(comm: Any, error: str | None) -> bool:
    """Collective: True when no rank has an error; else every rank prints the first one."""
    error = agree(comm, error)
    if error:
        say(comm, PROG, f"error: {error}")
    return not error


def main(argv: Sequence[str] | None = None) -> int:
    """Exit status: 0 written, 2 bad input (nothing written), 1 a failure while writing."""
    report_crashes()  # also under `python -m hpcdp.data.prep.cli` (mpirun, srun)
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in RECIPES:
        return int(importlib.import_module(RECIPES[argv[0]][0]).main(argv[1:]) or 0)
    args = parse_args(build_parser(), argv)
    try:
        comm = world()
    except PrepError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr, flush=True)
        return EXIT_BAD_INPUT
    error: str | None = None
    try:
        inputs = prepare_inputs(args, comm)
    except (src.SourceError, PrepError, OSError, ImportError) as exc:
        error = str(exc)
    # Agree on bad input before any collective file operation: every rank reports it.
    if not agreed(comm, error):
        return EXIT_BAD_INPUT
    try:
        os.makedirs(args.out, exist_ok=True)
    except OSError as exc:
        error = f"--out {args.out}: cannot make the folder: {exc.strerror or exc}"
    if not agreed(comm, error):
        return EXIT_BAD_INPUT
    start = time.perf_counter()
    status: list[int] = []
    written = write_or_abort(PROG, comm, lambda: _write(args, inputs, comm), status,
                             args.stall_timeout)
    if written is None:
        return status[0]
    if comm.rank == 0:
        try:
            _summary(args, inputs.sources, written, comm.size, time.perf_counter() - start)
        except OSError as exc:
            say(comm, PROG, f"error: --report {args.report}: {exc.strerror or exc}")
            return EXIT_WRITE_FAILED
    return 0


def _write(args: argparse.Namespace, inputs: Inputs, comm: Any) -> list[str]:
    """Collective: every split through the parts in OUT/.hpcdp-prep, removed once written."""
    with Parts(args.out, args.source, inputs.fingerprint(), comm, args.resume) as parts:
        return [write_split(args.out, s, inputs.opts, comm, parts) for s in inputs.sources]


def _summary(args: argparse.Namespace, sources: list[src.Source], written: list[str],
             ranks: int, seconds: float) -> None:
    nbytes = sum(s.num_samples * s.sample_bytes for s in sources)
    for path, source in zip(written, sources):
        print(f"hpcdp prep: wrote {path}: {source.num_samples} samples of "
              f"{source.sample_shape} {source.dtype}", flush=True)
    print(f"hpcdp prep: {nbytes / 2**20:.1f} MiB in {seconds:.2f} s on {ranks} rank(s)",
          flush=True)
    if args.report:
        with open(args.report, "w") as fh:
            json.dump({"ranks": ranks, "seconds": seconds, "bytes": nbytes,
                       "samples": sum(s.num_samples for s in sources),
                       "files": written}, fh, indent=2)


if __name__ == "__main__":
    sys.exit(main())
