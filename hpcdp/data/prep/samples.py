"""The recipes of fixed-shape samples: one `Recipe` per input format, from its own options
and the splits (`arrays.Source`) it reads; the file they all write is made here.

Each split becomes ``OUT/NAME.h5`` with the samples ``x`` (chunked along the sample axis,
about ``--chunk-mib`` a chunk) and, where the input has them, the int64 labels ``y``.
Blocks are whole chunks, so that no two ranks write into one chunk. The data transfer
is independent MPI-IO by default: each block is contiguous, and collective two-phase I/O
made 2 ranks on a shared 2-core machine about 1.8x slower than 1 (ranks wait for each
other every round); ``--mpio collective`` switches it on for file systems where
aggregation pays. With compression, rank 0 writes alone: parallel HDF5 1.10 cannot
reliably write filtered datasets through MPI-IO.

A format is `recipe(name, help, options, made, sources, files)`: ``options(parser)`` adds
its options, ``made(args)`` checks them into a frozen dataclass (what the splits are made
from, and so what a resume must share), ``sources(made, seed)`` opens its splits, and
``files(made)`` names the input files whose size and time a resume must find unchanged.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hpcdp.data.format.samples import CHUNK_BYTES, chunk_rows, label_chunk_rows, slab_rows
from hpcdp.data.prep import arrays as src
from hpcdp.data.prep import frame
from hpcdp.data.prep.blocks import items_per_block, plan_items
from hpcdp.data.prep.merge import root_attrs
from hpcdp.data.prep.recipe import SAME_BYTES, Recipe, Split
from hpcdp.data.prep.world import PrepError

COMPRESSIONS = ("none", "gzip", "lzf")
PROG = "hpcdp prep"
EXIT_STATUS = ("Exit status: 0 written; 2 bad input, an existing output file without "
               "--overwrite or an unfinished run's OUT/.hpcdp-prep without --resume (nothing "
               "written); 1 a failure while writing (old files kept; --resume continues).")
REFUSAL = ("{first} already exists; pass --overwrite to replace it (the old file stays "
           "until the new one is complete)")


@dataclass(frozen=True)
class Inputs:
    """The checked options: the writer's, the format's own (`made`) and the splits they
    open (which follow from those, so the fingerprint leaves them out)."""

    x_name: str
    y_name: str | None
    compression: str
    chunk_bytes: int
    seed: int
    source_name: str
    block_bytes: int
    made: Any
    sources: list[src.Source] = field(metadata=SAME_BYTES)
    collective: bool = field(default=False, metadata=SAME_BYTES)
    report: str | None = field(default=None, metadata=SAME_BYTES)


def _options(p: argparse.ArgumentParser) -> None:
    """The options of every samples recipe."""
    p.add_argument("--seed", type=int, default=0, help="seed of the data and the split")
    p.add_argument("--x-name", default="x", help="dataset name of the samples")
    p.add_argument("--y-name", default="y", help="dataset name of the labels")
    p.add_argument("--compression", choices=COMPRESSIONS, default="none",
                   help="filter for both datasets; with several ranks rank 0 writes alone")
    p.add_argument("--chunk-mib", type=float, default=CHUNK_BYTES / 2**20,
                   help="target chunk size in MiB (chunks run along the sample axis)")
    p.add_argument("--mpio", choices=("independent", "collective"), default="independent",
                   help="MPI-IO transfer of the data slabs with several ranks (default: "
                        "independent; every rank writes its own contiguous slab)")
    p.add_argument("--report", help="rank 0 writes timing and sizes as JSON here "
                                    "(replaced if it exists, like benchmark results)")


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


def _nearest_folder(path: str) -> str:
    where = os.path.abspath(path)
    while not os.path.exists(where):
        where = os.path.dirname(where)
    return where


def check_space(out: str, sources: Sequence[src.Source], compression: str) -> None:
    """Uncompressed output must fit the free space twice (the parts, then the files): fail
    now, not hours into the write."""
    if compression != "none":
        return
    need = 2 * sum(s.num_samples * (s.sample_bytes + 8) for s in sources)
    where = _nearest_folder(out)
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


def _check(name: str, made: Callable[[argparse.Namespace], Any],
           sources: Callable[[Any, int], list[src.Source]], args: argparse.Namespace) -> Inputs:
    """Every check of the options and inputs, on this rank; `PrepError` names a bad one."""
    if not (math.isfinite(args.chunk_mib) and 0 < args.chunk_mib * 2**20 <= src.MAX_SAMPLE_BYTES):
        raise PrepError(f"--chunk-mib {args.chunk_mib}: expected a size in MiB above 0 and "
                        "below 4096 (HDF5's chunk limit)")
    check_name("--x-name", args.x_name)
    if args.y_name:
        check_name("--y-name", args.y_name)
    if args.x_name == args.y_name:
        raise PrepError(f"--x-name and --y-name are both {args.x_name!r}")
    block_bytes = frame.block_bytes(args.block_mib)
    checked = made(args)
    if not 0 <= args.seed < 2**63:
        raise src.SourceError(f"--seed must be in [0, 2**63), got {args.seed}")
    opened = sources(checked, args.seed)
    for source in opened:
        src.check_sample_bytes(source.sample_shape, source.dtype, f"split {source.name}")
    check_space(args.out, opened, args.compression)
    check_report(args.report)
    return Inputs(args.x_name, args.y_name or None, args.compression,
                  max(1, int(args.chunk_mib * 2**20)), args.seed, name, block_bytes, checked,
                  opened, args.mpio == "collective", args.report)


def _chunk(inputs: Inputs, source: src.Source) -> int:
    return chunk_rows(source.sample_bytes, source.num_samples, inputs.chunk_bytes)


def splits(inputs: Inputs) -> list[Split]:
    """Each source's blocks: whole chunks, so that no two ranks write into one chunk."""
    out = []
    for s in inputs.sources:
        chunk = _chunk(inputs, s)
        blocks = plan_items(s.num_samples, items_per_block(
            s.sample_bytes, inputs.block_bytes, s.num_samples, unit=chunk))
        out.append(Split(s.name, blocks, "samples", "samples", slab_rows(chunk, s.sample_bytes),
                         "samples", serial=inputs.compression != "none",
                         collective=inputs.collective, source=s))
    return out


def read_block(inputs: Inputs, split: Split, block: range) -> dict[str, np.ndarray]:
    """A block's samples (and labels) as a part's arrays."""
    xs, ys = split.source.slab(block.start, block.stop)
    return {"x": xs, **({"y": ys} if inputs.y_name and split.source.has_labels else {})}


def datasets(inputs: Inputs, split: Split, f: Any, totals: dict[str, int],
             tally: Any) -> dict[str, Any]:
    """The datasets (by their part names, x and y) of a new file."""
    source, chunk = split.source, _chunk(inputs, split.source)
    comp: dict[str, Any] = {}
    if inputs.compression != "none":
        comp = {"compression": inputs.compression, "shuffle": inputs.compression == "gzip"}
    dsets = {"x": f.create_dataset(
        inputs.x_name, shape=(source.num_samples, *source.sample_shape), dtype=source.dtype,
        chunks=(chunk, *source.sample_shape), fill_time="never", **comp)}
    if inputs.y_name and source.has_labels:
        dsets["y"] = f.create_dataset(
            inputs.y_name, shape=(source.num_samples,), dtype=np.int64,
            chunks=(label_chunk_rows(chunk, source.num_samples),), fill_time="never", **comp)
    return dsets


def attributes(inputs: Inputs, split: Split, totals: dict[str, int],
               tally: Any) -> dict[str, Any]:
    """Root attributes: what is in the file and how it was made."""
    source = split.source
    schema = {inputs.x_name: {"shape": [source.num_samples, *source.sample_shape],
                            "dtype": str(source.dtype)}}
    if inputs.y_name and source.has_labels:
        schema[inputs.y_name] = {"shape": [source.num_samples], "dtype": "int64"}
    return root_attrs(schema, source.num_samples, inputs.source_name, source.name,
                      source.params, inputs.seed, source.attrs)


def summary(inputs: Inputs, written: list[str], seconds: float, ranks: int) -> None:
    nbytes = sum(s.num_samples * s.sample_bytes for s in inputs.sources)
    for path, source in zip(written, inputs.sources):
        print(f"{PROG}: wrote {path}: {source.num_samples} samples of "
              f"{source.sample_shape} {source.dtype}", flush=True)
    print(f"{PROG}: {nbytes / 2**20:.1f} MiB in {seconds:.2f} s on {ranks} rank(s)",
          flush=True)
    if inputs.report:
        try:
            with open(inputs.report, "w") as fh:
                json.dump({"ranks": ranks, "seconds": seconds, "bytes": nbytes,
                           "samples": sum(s.num_samples for s in inputs.sources),
                           "files": written}, fh, indent=2)
        except OSError as exc:
            raise OSError(f"--report {inputs.report}: {exc.strerror or exc}") from exc


def recipe(name: str, help: str, options: Callable[[argparse.ArgumentParser], None],
           made: Callable[[argparse.Namespace], Any],
           sources: Callable[[Any, int], list[src.Source]],
           files: Callable[[Any], Sequence[str]] = lambda made: ()) -> Recipe:
    """The samples recipe of one input format (see the module doc)."""

    def both(p: argparse.ArgumentParser) -> None:
        _options(p)
        options(p)

    return Recipe(
        name, help, both, lambda args, comm: _check(name, made, sources, args),
        lambda inputs: [f"{s.name}.h5" for s in inputs.sources], splits, read_block,
        datasets, summary, attributes, files=lambda inputs: files(inputs.made), prog=PROG,
        epilog=EXIT_STATUS, refusal=REFUSAL,
        bad_input=(src.SourceError, PrepError, OSError, ImportError))


# -- the built-in formats -------------------------------------------------------------


@dataclass(frozen=True)
class Digits:
    val_fraction: float


def _digits_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--val-fraction", type=float, default=0.2)


DIGITS = recipe("digits", "scikit-learn's bundled 8x8 digits -> train.h5, val.h5 (uint8)",
                _digits_options, lambda args: Digits(args.val_fraction),
                lambda made, seed: src.digits(seed, made.val_fraction))


@dataclass(frozen=True)
class Synthetic:
    samples: int
    shape: str
    dtype: str
    classes: int
    val_samples: int


def _synthetic_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--samples", type=int, required=True)
    p.add_argument("--shape", default="3,32,32", help="sample shape, e.g. 3,32,32")
    p.add_argument("--dtype", default="uint8")
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--val-samples", type=int, default=0, help="also write val.h5 with this many")


def _synthetic_sources(made: Synthetic, seed: int) -> list[src.Source]:
    if made.val_samples < 0:
        raise src.SourceError(f"--val-samples must be non-negative, got {made.val_samples}")
    return src.synthetic(made.samples, src.parse_shape(made.shape), made.dtype, made.classes,
                         seed, made.val_samples)


SYNTHETIC = recipe(
    "synthetic", "seeded random samples of any shape", _synthetic_options,
    lambda a: Synthetic(a.samples, a.shape, a.dtype, a.classes, a.val_samples),
    _synthetic_sources)


@dataclass(frozen=True)
class Arrays:
    x_path: str
    y_path: str | None
    x_key: str
    y_key: str
    split: str


def _arrays_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--x", required=True, dest="x_path", help="samples: .npy or .npz")
    p.add_argument("--y", dest="y_path", help="labels: .npy or .npz (default: none, or the "
                                              "--y-key member of the --x .npz)")
    p.add_argument("--x-key", default="x", help="member name inside a .npz")
    p.add_argument("--y-key", default="y", help="member name inside a .npz ('' for none)")
    p.add_argument("--split", default="train", help="output name: SPLIT.h5")


def _arrays_sources(made: Arrays, seed: int) -> list[src.Source]:
    check_name("--split", made.split)
    return src.arrays(made.x_path, made.y_path, made.x_key, made.y_key or None, made.split)


ARRAYS = recipe(
    "arrays", "your .npy/.npz arrays, memory-mapped (never loaded whole)", _arrays_options,
    lambda a: Arrays(a.x_path, a.y_path, a.x_key, a.y_key, a.split), _arrays_sources,
    lambda made: [p for p in (made.x_path, made.y_path) if p])
