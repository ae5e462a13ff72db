"""`datasets/images.py --root DIR --out OUT --size S`: an image folder -> OUT/train.h5, val.h5.

Runs on one process or under ``mpirun`` / ``srun --mpi=pmix``. Every rank scans
the folder and checks the options; then every rank decodes its share of the
files (by bytes) and the ranks agree on the undecodable ones, the class counts
and the training statistics; only then is anything created. Bad input ends
every rank with the same message (exit 2) and nothing written; a file already
in OUT is replaced only with ``--overwrite`` (written under a temporary name,
renamed when complete). Layout and decoding rules: `folder`, `decode`;
docs/data-images.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from hpcdp.cliargs import parse_args
from hpcdp.data.prep.frame import PrepError, agree, check_world, say, world, write_or_abort
from hpcdp.data.prep.images import folder
from hpcdp.data.prep.images.decode import FITS, MAX_PIXELS
from hpcdp.data.prep.images.stats import channel_stats
from hpcdp.data.prep.images.write import (
    Share,
    SplitFile,
    check_share,
    file_attrs,
    rank_share,
    write_split,
)
from hpcdp.runtime.crash import report_crashes

PROG = "datasets/images.py"
#: Bad files named in an error or a summary at most (the count is always given).
SHOW_BAD = 20


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG, description="Decode an image folder (one subfolder per class) into "
        "samples-first HDF5: x uint8 (N, 3, S, S), y int64, with the class names and the "
        "training set's per-channel mean and std.",
        epilog="Exit status: 0 written; 2 bad input or an existing output without "
               "--overwrite (nothing written); 1 a failure while writing (old files kept).")
    p.add_argument("--root", required=True,
                   help="DIR/train/<class>/* and DIR/val/<class>/*, or DIR/<class>/* with "
                        "--val-fraction")
    p.add_argument("--out", required=True, help="output folder (train.h5, val.h5)")
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
    p.add_argument("--overwrite", action="store_true", help="replace train.h5/val.h5 in --out")
    p.add_argument("--max-pixels", type=int, default=MAX_PIXELS,
                   help="an image declaring more pixels (width x height) is refused "
                        f"undecoded (default {MAX_PIXELS:,}: 8192 x 8192)")
    p.add_argument("--follow-symlinks", action="store_true",
                   help="read links that lead outside --root (refused by default)")
    return p


def check_out(out: str, names: Sequence[str], overwrite: bool) -> None:
    """The output folder can take the files; creates nothing."""
    if not out or "\0" in out:
        raise PrepError(f"--out {out!r}: expected a folder path")
    if os.path.exists(out) and not os.path.isdir(out):
        raise PrepError(f"--out {out}: exists and is not a folder")
    where = os.path.abspath(out)
    while not os.path.exists(where):
        where = os.path.dirname(where)
    if not os.access(where, os.W_OK | os.X_OK):
        raise PrepError(f"--out {out}: {where} is not writable")
    for name in names:
        final = os.path.join(out, name)
        if os.path.lexists(final) and not overwrite:
            raise PrepError(f"{final} already exists; pass --overwrite to replace it "
                            "(the old file stays until the new one is complete)")


def check(args: argparse.Namespace, comm: Any) -> folder.Layout:
    """Every check that needs no decoding, on this rank."""
    check_world(comm.size)
    if not 1 <= args.size <= 4096:
        raise PrepError(f"--size {args.size}: expected 1..4096 pixels")
    if not 0 <= args.seed < 2**63:
        raise PrepError(f"--seed must be in [0, 2**63), got {args.seed}")
    if args.max_pixels < 1:
        raise PrepError(f"--max-pixels {args.max_pixels}: expected a positive count")
    layout = folder.scan(args.root, args.val_fraction, args.seed, args.follow_symlinks)
    check_out(args.out, [f"{s}.h5" for s in layout.splits], args.overwrite)
    return layout


def _bad_message(bad: list[str]) -> str:
    shown = "\n  ".join(bad[:SHOW_BAD])
    more = f"\n  ... and {len(bad) - SHOW_BAD} more" if len(bad) > SHOW_BAD else ""
    return f"{len(bad)} file(s) cannot be decoded:\n  {shown}{more}"


def _class_counts(share: Share, classes: int) -> np.ndarray:
    labels = [share.entries[i].label for i in share.good]
    return np.bincount(np.asarray(labels, np.int64), minlength=classes)


def agree_on_shares(comm: Any, shares: list[Share], layout: folder.Layout,
                    skip_bad: bool) -> tuple[list[str], dict[str, int], tuple[list, list]]:
    """Collective: every rank's bad files (in file order), good counts per split and the
    training statistics; `PrepError` on every rank when the input cannot be written."""
    bad = [m for share in shares for rank_bad in comm.allgather(share.bad) for m in rank_bad]
    counts = {s.split: sum(comm.allgather(len(s.good))) for s in shares}
    train = next(s for s in shares if s.split == "train")
    per_class = sum(comm.allgather(_class_counts(train, len(layout.classes))))
    sums = sum(comm.allgather(train.sums))
    squares = sum(comm.allgather(train.squares))
    pixels = sum(comm.allgather(train.pixels))
    if bad and not skip_bad:
        raise PrepError(_bad_message(bad) + "\n(pass --skip-bad to leave them out)")
    empty = [c for c, n in zip(layout.classes, per_class) if n == 0]
    if empty:
        raise PrepError(f"class(es) {', '.join(map(repr, empty))}: no training image could "
                        "be decoded")
    return bad, counts, channel_stats(sums, squares, pixels)


def main(argv: Sequence[str] | None = None) -> int:
    """Exit status: 0 written, 2 bad input (nothing written), 1 a failure while writing."""
    report_crashes()
    args = parse_args(build_parser(), sys.argv[1:] if argv is None else argv)
    try:
        comm = world()
    except PrepError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr, flush=True)
        return 2
    error, layout, shares = None, None, []
    try:
        layout = check(args, comm)
    except (PrepError, OSError) as exc:
        error = str(exc)
    if _failed(comm, error):
        return 2
    assert layout is not None
    if comm.rank == 0:  # what the scan left out, before anything is decoded or written
        _scanned(layout)
    start = time.perf_counter()
    try:  # the first pass: decode this rank's share of every split
        shares = [check_share(name, rank_share(name, entries, comm.rank, comm.size),
                              args.size, args.fit, args.max_pixels)
                  for name, entries in layout.splits.items()]
    except (PrepError, OSError) as exc:
        error = str(exc)
    if _failed(comm, error):
        return 2
    try:
        bad, counts, (mean, std) = agree_on_shares(comm, shares, layout, args.skip_bad)
        os.makedirs(args.out, exist_ok=True)
    except (PrepError, OSError) as exc:
        error, bad = str(exc), []
    if _failed(comm, error):
        return 2
    params = {"size": args.size, "fit": args.fit, "val_fraction": args.val_fraction,
              "root": os.path.basename(os.path.abspath(args.root))}
    metas = [SplitFile(s.split, counts[s.split], args.size,
                       file_attrs(s.split, counts[s.split], args.size, layout.classes, mean,
                                  std, params, len(bad), args.seed))
             for s in shares]
    written = write_or_abort(PROG, comm, lambda: [
        write_split(args.out, share, meta, args.fit, comm, args.max_pixels)
        for share, meta in zip(shares, metas)])
    if written is None:
        return 1
    if comm.rank == 0:
        _summary(layout, metas, written, bad, mean, std, comm.size,
                 time.perf_counter() - start)
    return 0


def _failed(comm: Any, error: str | None) -> bool:
    """Collective: whether any rank has an error; every rank then prints the first."""
    error = agree(comm, error)
    if error:
        say(comm, PROG, f"error: {error}")
    return bool(error)


def _scanned(layout: folder.Layout) -> None:
    skipped = layout.skipped_hidden + layout.skipped_other
    listed = "".join(f"\n  {x}" for x in layout.skipped_examples)
    more = (f"\n  ... and {skipped - len(layout.skipped_examples)} more"
            if skipped > len(layout.skipped_examples) else "")
    print(f"{PROG}: {len(layout.classes)} classes; skipped {layout.skipped_hidden} hidden "
          f"and {layout.skipped_other} other file(s){':' if skipped else ''}{listed}{more}",
          flush=True)


def _summary(layout: folder.Layout, metas: list[SplitFile], written: list[str],
             bad: list[str], mean: list[float], std: list[float], ranks: int,
             seconds: float) -> None:
    for path, meta in zip(written, metas):
        print(f"{PROG}: wrote {path}: {meta.num_samples} images of 3x{meta.size}x{meta.size}",
              flush=True)
    if bad:
        print(f"{PROG}: --skip-bad left out {_bad_message(bad)}", flush=True)
    print(f"{PROG}: training mean {[round(m, 4) for m in mean]}, std "
          f"{[round(s, 4) for s in std]} (0..1 scale); {seconds:.2f} s on {ranks} rank(s)",
          flush=True)


if __name__ == "__main__":
    sys.exit(main())
