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
Layout and decoding rules: `folder`, `shards`, `decode`; docs/data-images.md.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from hpcdp.cliargs import parse_args
from hpcdp.data.format.image_decode import FITS, MAX_PIXELS
from hpcdp.data.prep import blocks as bk
from hpcdp.data.prep import stall
from hpcdp.data.prep.frame import (
    add_common_options,
    block_bytes,
    resume_note,
    resuming,
    write_or_abort,
)
from hpcdp.data.prep.images import folder, shards
from hpcdp.data.prep.images import write as iw
from hpcdp.data.prep.images.stats import channel_stats
from hpcdp.data.prep.parts import Parts
from hpcdp.data.prep.parts import fingerprint as made_from
from hpcdp.data.prep.progress import Progress
from hpcdp.data.prep.world import PrepError, agree, check_world, say, world
from hpcdp.runtime.crash import report_crashes

PROG = "datasets/images.py"
RECIPE = "images"
#: Bad files named in an error or a summary at most (the count is always given).
SHOW_BAD = 20
#: The input formats: a scanner of ``--root`` each, giving a `folder.Layout`.
INPUTS: dict[str, Callable[[str, float | None, int, bool], folder.Layout]] = {
    "folder": folder.scan, "tar": shards.scan}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG, description="Decode an image folder (one subfolder per class) or "
        "WebDataset-style tar shards (NNNN.jpg + NNNN.cls) into samples-first HDF5: x uint8 "
        "(N, 3, S, S), y int64, with the class names and the training set's per-channel "
        "mean and std.",
        epilog="Exit status: 0 written; 2 bad input or an existing output without "
               "--overwrite (nothing written); 1 a failure while writing (old files kept).")
    p.add_argument("--root", required=True,
                   help="DIR/train/<class>/* and DIR/val/<class>/*, or DIR/<class>/* with "
                        "--val-fraction; or tar shards DIR/train/*.tar and DIR/val/*.tar, "
                        "or DIR/*.tar with --val-fraction")
    p.add_argument("--input", choices=("auto", *INPUTS), default="auto",
                   help="the format of --root (default: tar when it holds *.tar shards, "
                        "else folder)")
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
    add_common_options(p)
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


def input_kind(args: argparse.Namespace) -> str:
    if args.input != "auto":
        return args.input
    return "tar" if shards.is_shard_root(args.root) else "folder"


def check(args: argparse.Namespace, comm: Any) -> folder.Layout:
    """Every check that needs no decoding, on this rank."""
    check_world(comm.size)
    if not 1 <= args.size <= 4096:
        raise PrepError(f"--size {args.size}: expected 1..4096 pixels")
    if not 0 <= args.seed < 2**63:
        raise PrepError(f"--seed must be in [0, 2**63), got {args.seed}")
    _block_bytes(args)
    if not os.path.isdir(args.root):
        raise PrepError(f"--root {args.root}: not a folder")
    if args.max_pixels < 1:
        raise PrepError(f"--max-pixels {args.max_pixels}: expected a positive count")
    layout = INPUTS[input_kind(args)](args.root, args.val_fraction, args.seed,
                                      args.follow_symlinks)
    check_out(args.out, [f"{s}.h5" for s in layout.splits],
              args.overwrite or resuming(args.out, args.resume))
    return layout


def _bad_message(bad: list[str]) -> str:
    shown = "\n  ".join(bad[:SHOW_BAD])
    more = f"\n  ... and {len(bad) - SHOW_BAD} more" if len(bad) > SHOW_BAD else ""
    return f"{len(bad)} file(s) cannot be decoded:\n  {shown}{more}"


def fingerprint(args: argparse.Namespace, layout: folder.Layout) -> dict[str, Any]:
    """What changes the parts or the files: the options, and every listed file and size."""
    listing = hashlib.sha256()
    for name, entries in layout.splits.items():
        for e in entries:
            listing.update(os.fsencode(f"{name}\0{e.path}\0{e.label}\0{e.nbytes}\n"))
    return made_from({"root": os.path.abspath(args.root), "input": input_kind(args),
                      "size": args.size, "fit": args.fit, "val_fraction": args.val_fraction,
                      "seed": args.seed, "skip_bad": args.skip_bad,
                      "block_bytes": _block_bytes(args), "files_sha256": listing.hexdigest()})


def _block_bytes(args: argparse.Namespace) -> int:
    return block_bytes(args.block_mib)


def decode_all(args: argparse.Namespace, layout: folder.Layout, parts: Parts,
               comm: Any) -> dict[str, range]:
    """Collective: every split decoded into parts; this rank's blocks of each split."""
    total = sum(len(e) for e in layout.splits.values())
    progress = Progress(comm, "decoded", total, "files", PROG)
    mine, error = {}, None
    for name, entries in layout.splits.items():
        per_block = bk.items_per_block(3 * args.size**2, _block_bytes(args), len(entries))
        blocks = bk.plan_items(len(entries), per_block)
        mine[name] = bk.rank_blocks(len(blocks), comm.rank, comm.size)
        resume_note(comm, PROG, parts, name, mine[name])
        error = error or iw.decode_blocks(name, entries, blocks, mine[name], args.size,
                                          args.fit, parts, progress, args.max_pixels)
    progress.close()
    error = agree(comm, error)
    if error:
        raise PrepError(error)
    return mine


def agree_on_input(args: argparse.Namespace, layout: folder.Layout, parts: Parts,
                   mine: dict[str, range], comm: Any) -> dict[str, iw.Summary]:
    """Collective: each split's summary; `PrepError` on every rank when the input cannot
    be written (bad files without --skip-bad, a class without training images)."""
    got = {name: iw.summarize(name, parts, mine[name], len(layout.classes), comm)
           for name in layout.splits}
    bad = [m for s in got.values() for m in s.bad]
    if bad and not args.skip_bad:
        raise PrepError(_bad_message(bad) + "\n(pass --skip-bad to leave them out)")
    empty = [c for c, n in zip(layout.classes, got["train"].per_class) if n == 0]
    if empty:
        raise PrepError(f"class(es) {', '.join(map(repr, empty))}: no training image could "
                        "be decoded")
    return got


def prepare(args: argparse.Namespace, layout: folder.Layout, comm: Any
            ) -> tuple[Parts, dict[str, range], dict[str, iw.Summary]]:
    """Collective: the parts decoded and agreed on; on bad input they are removed."""
    made = not os.path.isdir(args.out)
    comm.Barrier()  # every rank has looked before one makes it
    os.makedirs(args.out, exist_ok=True)
    parts = Parts(args.out, RECIPE, fingerprint(args, layout), comm, args.resume)
    try:
        mine = decode_all(args, layout, parts, comm)
        return parts, mine, agree_on_input(args, layout, parts, mine, comm)
    except PrepError:  # the same on every rank: nothing written, nothing kept to resume
        parts.remove()
        if made and comm.rank == 0:
            os.rmdir(args.out)
        raise


def main(argv: Sequence[str] | None = None) -> int:
    """Exit status: 0 written, 2 bad input (nothing written), 1 a failure while writing."""
    report_crashes()
    args = parse_args(build_parser(), sys.argv[1:] if argv is None else argv)
    try:
        comm = world()
    except PrepError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr, flush=True)
        return 2
    error, layout = None, None
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
    try:
        with stall.guarded(comm, PROG, args.stall_timeout):  # decoding: as in the writing
            parts, mine, summaries = prepare(args, layout, comm)
    except PrepError as exc:
        say(comm, PROG, f"error: {exc}")
        return 2
    bad = [m for s in summaries.values() for m in s.bad]
    t = summaries["train"]
    mean, std = channel_stats(t.sums, t.squares, t.pixels)
    params = {"size": args.size, "fit": args.fit, "val_fraction": args.val_fraction,
              "root": os.path.basename(os.path.abspath(args.root))}
    metas = [iw.SplitFile(name, s.count, args.size,
                          iw.file_attrs(name, s.count, args.size, layout.classes, mean, std,
                                        params, len(bad), args.seed))
             for name, s in summaries.items()]
    written = write_or_abort(PROG, comm, lambda: _write(args, parts, mine, metas, comm),
                             stall_s=args.stall_timeout)
    if written is None:
        return 1
    if comm.rank == 0:
        _summary(layout, metas, written, bad, mean, std, comm.size,
                 time.perf_counter() - start)
    return 0


def _write(args: argparse.Namespace, parts: Parts, mine: dict[str, range],
           metas: list[iw.SplitFile], comm: Any) -> list[str]:
    written = [iw.write_split(os.path.join(args.out, f"{m.name}.h5"), parts, mine[m.name], m,
                              comm) for m in metas]
    parts.remove()
    return written


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


def _summary(layout: folder.Layout, metas: list[iw.SplitFile], written: list[str],
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
