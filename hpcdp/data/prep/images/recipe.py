"""`datasets/images.py --root DIR --out OUT --size S`: an image folder or tar shards ->
OUT/train.h5, val.h5.

Runs on one process or under ``mpirun`` / ``srun --mpi=pmix``. Every rank scans
the input and checks the options; then every rank decodes its blocks of each
split's files once, into parts in ``OUT/.hpcdp-prep/`` (`write`), and the ranks agree
on the undecodable ones, the class counts and the training statistics; only then
is anything created. Bad input ends every rank with the same message (exit 2) and
nothing written; a file already in OUT is replaced only with ``--overwrite``
(written under a temporary name, renamed when complete). A stopped run continues
from its saved blocks with ``--resume``.

The input formats are `INPUTS`, one scanner each giving the same `folder.Layout`:
an image folder (`folder`) or WebDataset-style tar shards (`shards`); a new format
is one more scanner there, and its entries one more case of `write.source_of`.
`RECIPE` runs in `frame.main` with a write phase of its own (`write`): every split is
decoded and the ranks agree on it before the first file is made.
Layout and decoding rules: `folder`, `shards`, `decode`; docs/data-images.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hpcdp.data.format import samples
from hpcdp.data.format.image_decode import FITS, MAX_PIXELS
from hpcdp.data.prep import blocks as bk
from hpcdp.data.prep import frame
from hpcdp.data.prep.images import folder, shards
from hpcdp.data.prep.images import write as iw
from hpcdp.data.prep.images.stats import channel_stats
from hpcdp.data.prep.progress import Progress
from hpcdp.data.prep.recipe import SAME_BYTES, Recipe, Run, Split
from hpcdp.data.prep.world import PrepError, raise_agreed

PROG = "datasets/images.py"
#: Bad files named in an error or a summary at most (the count is always given).
SHOW_BAD = 20
#: The input formats: a scanner of ``--root`` each, giving a `folder.Layout`.
INPUTS: dict[str, Callable[[str, float | None, int, bool], folder.Layout]] = {
    "folder": folder.scan, "tar": shards.scan}


def _options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--root", required=True,
                   help="DIR/train/<class>/* and DIR/val/<class>/*, or DIR/<class>/* with "
                        "--val-fraction; or tar shards DIR/train/*.tar and DIR/val/*.tar, "
                        "or DIR/*.tar with --val-fraction")
    p.add_argument("--input", choices=("auto", *INPUTS), default="auto",
                   help="the format of --root (default: tar when it holds *.tar shards, "
                        "else folder)")
    p.add_argument("--size", type=int, required=True, help="S: images become S x S")
    p.add_argument("--fit", choices=FITS, default="crop",
                   help="crop: shorter side to S, centre crop (default); stretch: S x S "
                        "ignoring the aspect; pad: longer side to S, centred on black")
    p.add_argument("--val-fraction", type=float, default=None,
                   help="one-folder layout: this fraction of each class to val.h5 "
                        "(a split seeded by --seed)")
    p.add_argument("--seed", type=int, default=0, help="seed of the split and the file order")
    p.add_argument("--skip-bad", action="store_true",
                   help="leave out files Pillow cannot decode (counted and listed) instead "
                        "of stopping")
    p.add_argument("--max-pixels", type=int, default=MAX_PIXELS,
                   help="an image declaring more pixels (width x height) is refused "
                        f"undecoded (default {MAX_PIXELS:,}: 8192 x 8192)")
    p.add_argument("--follow-symlinks", action="store_true",
                   help="read links that lead outside --root (refused by default)")


@dataclass(frozen=True)
class Inputs:
    """The checked options and the scanned layout; a resume must share every field but
    those marked (the listing's digest covers the layout)."""

    root: str
    input: str
    size: int
    fit: str
    val_fraction: float | None
    seed: int
    skip_bad: bool
    block_bytes: int
    files_sha256: str
    max_pixels: int = field(metadata=SAME_BYTES)
    layout: folder.Layout = field(metadata=SAME_BYTES)


def _listing(layout: folder.Layout) -> str:
    """A digest of every listed file, its split, class and size."""
    listing = hashlib.sha256()
    for name, entries in layout.splits.items():
        for e in entries:
            listing.update(os.fsencode(f"{name}\0{e.path}\0{e.label}\0{e.nbytes}\n"))
    return listing.hexdigest()


def check(args: argparse.Namespace, comm: Any) -> Inputs:
    """Every check that needs no decoding, on this rank."""
    if not 1 <= args.size <= 4096:
        raise PrepError(f"--size {args.size}: expected 1..4096 pixels")
    if not 0 <= args.seed < 2**63:
        raise PrepError(f"--seed must be in [0, 2**63), got {args.seed}")
    block_bytes = frame.block_bytes(args.block_mib)
    if not os.path.isdir(args.root):
        raise PrepError(f"--root {args.root}: not a folder")
    if args.max_pixels < 1:
        raise PrepError(f"--max-pixels {args.max_pixels}: expected a positive count")
    kind = args.input if args.input != "auto" else (
        "tar" if shards.is_shard_root(args.root) else "folder")
    layout = INPUTS[kind](args.root, args.val_fraction, args.seed, args.follow_symlinks)
    return Inputs(os.path.abspath(args.root), kind, args.size, args.fit, args.val_fraction,
                  args.seed, args.skip_bad, block_bytes, _listing(layout), args.max_pixels,
                  layout)


def _bad_message(bad: list[str]) -> str:
    shown = "\n  ".join(bad[:SHOW_BAD])
    more = f"\n  ... and {len(bad) - SHOW_BAD} more" if len(bad) > SHOW_BAD else ""
    return f"{len(bad)} file(s) cannot be decoded:\n  {shown}{more}"


def splits(inputs: Inputs) -> list[Split]:
    """Each split's files in blocks of about ``--block-mib`` of decoded pixels (the rows
    per write follow from the images that decode: `write`)."""
    sample = 3 * inputs.size**2
    return [Split(name, bk.plan_items(len(entries), bk.items_per_block(
                sample, inputs.block_bytes, len(entries))), "decoded", "files", 0,
                  source=entries)
            for name, entries in inputs.layout.splits.items()]


def agree_on_input(inputs: Inputs, run: Run, mine: dict[str, range]) -> dict[str, iw.Summary]:
    """Collective: each split's summary; `PrepError` on every rank when the input cannot
    be written (bad files without --skip-bad, a class without training images)."""
    layout = inputs.layout
    got = {name: iw.summarize(name, run.parts, mine[name], len(layout.classes), run.comm)
           for name in layout.splits}
    bad = [m for s in got.values() for m in s.bad]
    if bad and not inputs.skip_bad:
        raise PrepError(_bad_message(bad) + "\n(pass --skip-bad to leave them out)")
    empty = [c for c, n in zip(layout.classes, got["train"].per_class) if n == 0]
    if empty:
        raise PrepError(f"class(es) {', '.join(map(repr, empty))}: no training image could "
                        "be decoded")
    return got


@dataclass(frozen=True)
class Written:
    paths: list[str]
    metas: list[iw.SplitFile]
    bad: list[str]
    mean: list[float]
    std: list[float]


def write(run: Run) -> Written:
    """Collective: every split decoded into parts and agreed on (bad files, class counts,
    statistics) before the first file is made; then the files."""
    inputs, comm = run.inputs, run.comm
    if comm.rank == 0:  # what the scan left out, before anything is decoded or written
        _scanned(inputs.layout)
    todo = splits(inputs)
    progress = Progress(comm, "decoded", sum(len(s.source) for s in todo), "files", PROG)
    mine, error = {}, None
    for s in todo:
        mine[s.name] = bk.rank_blocks(len(s.blocks), comm.rank, comm.size)
        frame.resume_note(comm, PROG, run.parts, s.name, mine[s.name])
        error = error or iw.decode_blocks(s.name, s.source, s.blocks, mine[s.name],
                                          inputs.size, inputs.fit, run.parts, progress,
                                          inputs.max_pixels)
    progress.close()
    raise_agreed(comm, error)
    summaries = agree_on_input(inputs, run, mine)
    bad = [m for s in summaries.values() for m in s.bad]
    t = summaries["train"]
    mean, std = channel_stats(t.sums, t.squares, t.pixels)
    params = {"size": inputs.size, "fit": inputs.fit, "val_fraction": inputs.val_fraction,
              "root": os.path.basename(inputs.root)}
    metas, paths = [], []
    for s in todo:
        count = summaries[s.name].count
        meta = iw.SplitFile(s.name, count, inputs.size, iw.file_attrs(
            s.name, count, inputs.size, inputs.layout.classes, mean, std, params, len(bad),
            inputs.seed))
        chunk = samples.chunk_rows(3 * inputs.size**2, count)
        rows = samples.slab_rows(chunk, 3 * inputs.size**2)
        paths.append(run.write(dataclasses.replace(s, slab_rows=rows), mine[s.name], meta))
        metas.append(meta)
    return Written(paths, metas, bad, mean, std)


def datasets(inputs: Inputs, split: Split, f: Any, totals: dict[str, int],
             meta: iw.SplitFile) -> dict[str, Any]:
    s, total = meta.size, totals["x"]
    chunk = samples.chunk_rows(3 * s * s, meta.num_samples)
    x = f.create_dataset("x", shape=(total, 3, s, s), dtype=np.uint8,
                         chunks=(chunk, 3, s, s), fill_time="never")
    y = f.create_dataset("y", shape=(total,), dtype=np.int64,
                         chunks=(samples.label_chunk_rows(chunk, total),), fill_time="never")
    return {"x": x, "y": y}


def _scanned(layout: folder.Layout) -> None:
    skipped = layout.skipped_hidden + layout.skipped_other
    listed = "".join(f"\n  {x}" for x in layout.skipped_examples)
    more = (f"\n  ... and {skipped - len(layout.skipped_examples)} more"
            if skipped > len(layout.skipped_examples) else "")
    print(f"{PROG}: {len(layout.classes)} classes; skipped {layout.skipped_hidden} hidden "
          f"and {layout.skipped_other} other file(s){':' if skipped else ''}{listed}{more}",
          flush=True)


def summary(inputs: Inputs, written: Written, seconds: float, ranks: int) -> None:
    for path, meta in zip(written.paths, written.metas):
        print(f"{PROG}: wrote {path}: {meta.num_samples} images of 3x{meta.size}x{meta.size}",
              flush=True)
    if written.bad:
        print(f"{PROG}: --skip-bad left out {_bad_message(written.bad)}", flush=True)
    print(f"{PROG}: training mean {[round(m, 4) for m in written.mean]}, std "
          f"{[round(s, 4) for s in written.std]} (0..1 scale); {seconds:.2f} s on {ranks} "
          "rank(s)", flush=True)


RECIPE = Recipe(
    "images", "an image folder (one subfolder per class) -> uint8 samples", _options, check,
    lambda inputs: [f"{s}.h5" for s in inputs.layout.splits], splits, None, datasets,
    summary, lambda inputs, split, totals, meta: meta.attrs, write=write, prog=PROG,
    description="Decode an image folder (one subfolder per class) or WebDataset-style tar "
    "shards (NNNN.jpg + NNNN.cls) into samples-first HDF5: x uint8 (N, 3, S, S), y int64, "
    "with the class names and the training set's per-channel mean and std.",
    epilog="Exit status: 0 written; 2 bad input or an existing output without --overwrite "
           "(nothing written); 1 a failure while writing (old files kept).",
    refusal="{first} already exists; pass --overwrite to replace it (the old file stays "
            "until the new one is complete)")


def main(argv: Sequence[str] | None = None) -> int:
    return frame.main(RECIPE, argv)


if __name__ == "__main__":
    sys.exit(main())
