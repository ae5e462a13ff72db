"""How every preparation recipe runs over ranks: the part that is not about its data.

The recipes share one discipline: every rank checks the input and the ranks agree on the
first error before any collective file operation (`world`), so bad input ends every rank
with the same message, exit status `EXIT_BAD_INPUT` and nothing written; the input is cut
into blocks (`blocks`) that each rank turns into per-block parts (`save_blocks`, `parts`),
so memory is bounded by a block and a killed run resumes from its completed blocks; the
final files are written from the parts in block order (`merge`), each renamed into place
once every rank is done, so a failed run (`EXIT_WRITE_FAILED`) never replaces a good file;
a rank that fails mid-write aborts the job instead of leaving the others waiting in a
collective; rank 0 reports progress (`progress`). `main` is that frame for a recipe value
(`recipe.Recipe`); beside it are the output checks and the options every recipe shares,
and `run`, the frame of the recipes that still parse their own command line.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np

from hpcdp.cliargs import parse_args
from hpcdp.data.prep import stall
from hpcdp.data.prep.blocks import DEFAULT_BLOCK_BYTES, rank_blocks
from hpcdp.data.prep.merge import part_layout, write_parts
from hpcdp.data.prep.parts import WORK_DIR, Parts, fingerprint
from hpcdp.data.prep.progress import Progress
from hpcdp.data.prep.recipe import REFUSAL, Recipe, Run, Split
from hpcdp.data.prep.world import PrepError, agree, allreduce, check_world, say, world
from hpcdp.runtime.crash import report_crashes

#: Exit statuses of every recipe: bad input (every rank says why; nothing written), and a
#: failure while writing (the files already there are kept).
EXIT_BAD_INPUT = 2
EXIT_WRITE_FAILED = 1

Inputs = TypeVar("Inputs")
Written = TypeVar("Written")


# -- output ---------------------------------------------------------------------------


def resuming(out_dir: str, resume: bool) -> bool:
    """Whether this run continues an unfinished one in `out_dir` (its work folder is there):
    then the outputs it already renamed into place are its own, not files to protect."""
    return resume and os.path.isdir(os.path.join(out_dir, WORK_DIR))


def check_outputs(out_dir: str, names: Sequence[str], overwrite: bool,
                  refusal: str = REFUSAL, resume: bool = False, make: bool = True) -> None:
    """The output folder is usable (made if missing, with `make`), and none of `names` in
    it is replaced unless `overwrite` (or `resume` continues the run that wrote them).
    `refusal` words the refusal from ``out``, ``names`` (those found, comma-separated) and
    ``first`` (the path of the first found)."""
    if not out_dir or "\0" in out_dir:
        raise PrepError(f"--out {out_dir!r}: expected a folder path")
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise PrepError(f"--out {out_dir}: exists and is not a folder")
    where = os.path.abspath(out_dir)
    while not os.path.exists(where):  # where a new folder would be made
        where = os.path.dirname(where)
    if not os.path.isdir(where):
        raise PrepError(f"--out {out_dir}: {where} is not a folder")
    if not os.access(where, os.W_OK | os.X_OK):
        raise PrepError(f"--out {out_dir}: {where} is not writable")
    for name in names:
        if os.path.isdir(os.path.join(out_dir, name)):
            raise PrepError(f"{os.path.join(out_dir, name)} is a folder; a dataset cannot "
                            "replace it")
    existing = [n for n in names if os.path.lexists(os.path.join(out_dir, n))]
    if existing and not overwrite and not resuming(out_dir, resume):
        raise PrepError(refusal.format(out=out_dir, names=", ".join(existing),
                                       first=os.path.join(out_dir, existing[0])))
    if make:
        os.makedirs(out_dir, exist_ok=True)


# -- the frame ------------------------------------------------------------------------


def main(recipe: Recipe, argv: Sequence[str] | None = None) -> int:
    """`recipe` from its command line to its summary, on every rank; the exit status:
    0 written, `EXIT_BAD_INPUT` (nothing written), `EXIT_WRITE_FAILED`, `stall.EXIT_STALLED`.

    Every rank checks the options, the inputs and the outputs, and the ranks agree on the
    first error before the output folder is made; then the parts and the files are
    written under the stall guard (`write_or_abort`), and rank 0 prints the summary.
    """
    report_crashes()  # also under `python -m ...` (mpirun, srun)
    prog = recipe.says
    args = parse_args(parser(recipe), sys.argv[1:] if argv is None else argv)
    try:
        comm = world()
    except PrepError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr, flush=True)
        return EXIT_BAD_INPUT
    error, inputs = None, None
    try:
        check_world(comm.size)
        inputs = recipe.check(args, comm)
        check_outputs(args.out, recipe.outputs(inputs), args.overwrite, recipe.refusal,
                      args.resume, make=False)
    except recipe.bad_input as exc:
        error = str(exc)
    made = not os.path.isdir(args.out)
    if not _agreed(comm, prog, error):
        return EXIT_BAD_INPUT
    comm.Barrier()  # every rank has looked before one makes it
    try:
        os.makedirs(args.out, exist_ok=True)
    except OSError as exc:
        error = f"--out {args.out}: cannot make the folder: {exc.strerror or exc}"
    if not _agreed(comm, prog, error):
        return EXIT_BAD_INPUT
    start = time.perf_counter()
    status: list[int] = []
    written = write_or_abort(prog, comm, lambda: _write(recipe, inputs, args, comm),
                             status, args.stall_timeout)
    if status:
        if status[0] == EXIT_BAD_INPUT and made and comm.rank == 0:
            with contextlib.suppress(OSError):  # nothing written: not even the folder
                os.rmdir(args.out)
        return status[0]
    if comm.rank == 0:
        try:
            recipe.summary(inputs, written, time.perf_counter() - start, comm.size)
        except OSError as exc:
            say(comm, prog, f"error: {exc}")
            return EXIT_WRITE_FAILED
    return 0


def parser(recipe: Recipe) -> argparse.ArgumentParser:
    """The recipe's command line (``hpcdp prep NAME``): the common options and its own."""
    p = argparse.ArgumentParser(prog=f"hpcdp prep {recipe.name}",
                                description=recipe.description or recipe.help,
                                epilog=recipe.epilog)
    p.add_argument("--out", required=True,
                   help="output folder (one NAME.h5 per split); a file already there is an "
                        "error unless --overwrite")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the files already in --out (each new file is written under "
                        "a temporary name and renamed over the old one only when complete)")
    recipe.options(p)
    add_common_options(p, recipe.block_mib)
    return p


def _agreed(comm: Any, prog: str, error: str | None) -> bool:
    """Collective: True when no rank has an error; else every rank prints the first one."""
    error = agree(comm, error)
    if error:
        say(comm, prog, f"error: {error}")
    return not error


def _write(recipe: Recipe, inputs: Any, args: argparse.Namespace, comm: Any) -> Any:
    """Collective: the parts in OUT/.hpcdp-prep (removed once written), then the files."""
    made_from = fingerprint(inputs, files=recipe.files(inputs))
    with Parts(args.out, recipe.name, made_from, comm, args.resume) as parts:
        run = Run(recipe, inputs, args.out, parts, comm,
                  save=lambda split: save_split(recipe, inputs, parts, split, comm),
                  write=lambda split, mine, tally=_UNSET: write_split(
                      recipe, inputs, args.out, parts, split, mine, comm, tally))
        if recipe.write is not None:
            return recipe.write(run)
        return [run.write(split, run.save(split)) for split in recipe.splits(inputs)]


_UNSET = object()


def save_split(recipe: Recipe, inputs: Any, parts: Parts, split: Split, comm: Any) -> range:
    """Collective: this rank's blocks of `split` saved as parts (``recipe.read_block``);
    its blocks."""
    mine = rank_blocks(len(split.blocks), comm.rank, comm.size)
    save_blocks(comm, recipe.says, parts, split.name, split.blocks, mine, split.what,
                split.unit, lambda i: recipe.read_block(inputs, split, split.blocks[i]))
    return mine


def write_split(recipe: Recipe, inputs: Any, out: str, parts: Parts, split: Split,
                mine: Sequence[int], comm: Any, tally: Any = _UNSET) -> str:
    """Collective: OUT/SPLIT.h5 from every rank's parts of `split` (this rank's: `mine`),
    its datasets and attributes the recipe's; the path."""
    layout = part_layout(parts, split.parts or split.name, mine, comm)
    if tally is _UNSET:
        tally = recipe.tally(inputs, split, parts, mine, comm)

    def create(f: Any, rows: int) -> dict[str, Any]:
        dsets = recipe.datasets(inputs, split, f, layout.totals, tally)
        for key, value in recipe.attributes(inputs, split, layout.totals, tally).items():
            f.attrs[key] = value
        for name, (_, above) in (split.shift or {}).items():
            if comm.rank == 0 and above:
                dsets[name][:above] = 0
        return dsets

    bar = None
    if split.file_unit:
        rows = layout.totals.get(next(iter(layout.totals), ""), 0)
        bar = Progress(comm, f"{split.name}: file", rows, split.file_unit, recipe.says)
    path = os.path.join(out, f"{split.name}.h5")
    write_parts(path, parts, split.parts or split.name, mine, create, comm, split.slab_rows,
                serial=split.serial, progress=bar, layout=layout, shift=split.shift,
                collective=split.collective)
    if bar is not None:
        bar.close()
    return path


# -- the stall guard and the exit statuses of a write ----------------------------------


def write_or_abort(prog: str, comm: Any, write: Callable[[], Written],
                   status: list[int] | None = None,
                   stall_s: float = stall.DEFAULT_BOUND_S) -> Written | None:
    """Collective: what `write` returns, or None once its failure is reported (and its
    exit status appended to `status`).

    A `PrepError` from `write` is bad input found while reading (a bad line, an empty
    split): it must be raised on every rank alike (after `agree`), and before any final
    file is renamed into place; its status is `EXIT_BAD_INPUT`. Any other failure aborts
    the job with `EXIT_WRITE_FAILED`: the other ranks may be waiting in a collective for
    the one that failed. So does a rank that works longer than `stall_s` without progress
    (`stall.guarded`; `stall.EXIT_STALLED`).
    """
    try:
        with stall.guarded(comm, prog, stall_s):
            return write()
    except PrepError as exc:
        say(comm, prog, f"error: {exc}")
        code = EXIT_BAD_INPUT
    except Exception as exc:  # noqa: BLE001 - a rank failing mid-write must not hang the others
        say(comm, prog, f"error while writing: {type(exc).__name__}: {exc} (the blocks "
                        "completed are kept: the same command with --resume continues)")
        if comm.size > 1:
            comm.Abort(EXIT_WRITE_FAILED)
        code = EXIT_WRITE_FAILED
    if status is not None:
        status.append(code)
    return None


# -- blocks to parts, and the options every recipe shares -----------------------------


def resume_note(comm: Any, prog: str, parts: Parts, split: str, blocks: range) -> None:
    """Collective: in a resumed run, rank 0 says how many of `split`'s blocks were done."""
    if not parts.resumed:
        return
    done = allreduce(comm, sum(parts.done(split, i) for i in blocks))
    total = allreduce(comm, len(blocks))
    if comm.rank == 0:
        print(f"{prog}: {split}: resuming: {done} of {total} blocks already done",
              file=sys.stderr, flush=True)


def save_blocks(comm: Any, prog: str, parts: Parts, split: str, blocks: Sequence[range],
                mine: range, what: str, unit: str,
                read_block: Callable[[int], dict[str, np.ndarray]]) -> None:
    """Collective: this rank's blocks of `split` (`mine`, of the item ranges `blocks`) as
    parts, each the arrays ``read_block(i)`` names, those an earlier run saved skipped; one
    block in memory at a time. Rank 0 reports the items done as ``SPLIT: what`` in `unit`s."""
    resume_note(comm, prog, parts, split, mine)
    bar = Progress(comm, f"{split}: {what}", sum(map(_size, blocks)), unit, prog)
    for i in mine:
        resumed = parts.done(split, i)
        if not resumed:
            parts.save(split, i, **read_block(i))
        bar.advance(_size(blocks[i]), resumed)
    bar.close()


def _size(block: Any) -> int:
    """What a block counts for in the progress: its items, or its bytes."""
    return len(block) if isinstance(block, range) else int(block.nbytes)


def add_common_options(parser: argparse.ArgumentParser, blocks: bool = True) -> None:
    """``--resume`` and ``--stall-timeout`` (every recipe) and ``--block-mib`` (those that
    read big inputs)."""
    parser.add_argument(
        "--resume", action="store_true",
        help="continue an interrupted run of the same command from its completed blocks "
             "(kept in OUT/.hpcdp-prep/); without it such a folder is an error")
    parser.add_argument(
        "--stall-timeout", type=_seconds, default=stall.DEFAULT_BOUND_S, metavar="S",
        help="end the job when a rank works this many seconds without finishing a block "
             f"(or a batch), naming it (default {stall.DEFAULT_BOUND_S:g}; 0: never); "
             "waiting for other ranks does not count")
    if blocks:
        parser.add_argument(
            "--block-mib", type=float, default=DEFAULT_BLOCK_BYTES / 2**20,
            help="input read, held and saved per block, in MiB (default "
                 f"{DEFAULT_BLOCK_BYTES >> 20}): a rank's memory is about one block in and "
                 "one out, whatever the input size")


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"{text!r}: expected seconds, 0 or more")
    return value


def block_bytes(block_mib: float) -> int:
    """``--block-mib`` in bytes; `PrepError` unless a size of at least one byte."""
    if not (math.isfinite(block_mib) and block_mib * 2**20 >= 1):
        raise PrepError(f"--block-mib {block_mib}: expected a positive size in MiB")
    return int(block_mib * 2**20)
