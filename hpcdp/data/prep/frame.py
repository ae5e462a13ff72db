"""How every preparation recipe runs over ranks: the part that is not about its data.

The recipes share one discipline: every rank checks the input and the ranks agree on the
first error before any collective file operation (`world`), so bad input ends every rank
with the same message, exit status `EXIT_BAD_INPUT` and nothing written; the input is cut
into blocks (`blocks`) that each rank turns into per-block parts (`save_blocks`, `parts`),
so memory is bounded by a block and a killed run resumes from its completed blocks; the
final files are written from the parts in block order (`merge`), each renamed into place
once every rank is done, so a failed run (`EXIT_WRITE_FAILED`) never replaces a good file;
a rank that fails mid-write aborts the job instead of leaving the others waiting in a
collective; rank 0 reports progress (`progress`). `run` is that frame; beside it are the
output checks and the options every recipe shares.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np

from hpcdp.data.prep import stall
from hpcdp.data.prep.blocks import DEFAULT_BLOCK_BYTES
from hpcdp.data.prep.parts import WORK_DIR, Parts
from hpcdp.data.prep.progress import Progress
from hpcdp.data.prep.world import PrepError, agree, allreduce, say

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
                  refusal: str = "--out {out}: {names} already exist; pass --overwrite to "
                                 "replace them", resume: bool = False) -> None:
    """The output folder is usable (made if missing), and none of `names` in it is replaced
    unless `overwrite` (or `resume` continues the run that wrote them). `refusal` words the
    refusal from ``out``, ``names`` (those found, comma-separated) and ``first`` (the path of
    the first found)."""
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise PrepError(f"--out {out_dir}: exists and is not a folder")
    existing = [n for n in names if os.path.exists(os.path.join(out_dir, n))]
    if existing and not overwrite and not resuming(out_dir, resume):
        raise PrepError(refusal.format(out=out_dir, names=", ".join(existing),
                                       first=os.path.join(out_dir, existing[0])))
    os.makedirs(out_dir, exist_ok=True)
    if not os.access(out_dir, os.W_OK):
        raise PrepError(f"--out {out_dir}: not writable")


# -- the frame ------------------------------------------------------------------------


def run(prog: str, comm: Any, check: Callable[[], Inputs], write: Callable[[Inputs], Written],
        summary: Callable[[Written, float], None],
        bad_input: tuple[type[BaseException], ...] = (PrepError, OSError, ImportError),
        stall_s: float = stall.DEFAULT_BOUND_S) -> int:
    """Collective: a recipe from its checks to its summary; the exit status.

    `check` runs on every rank and raises one of `bad_input`; the ranks agree on
    the first error and all exit `EXIT_BAD_INPUT` with nothing written. Then
    `write_or_abort` runs `write` (bad input it finds on the way: `EXIT_BAD_INPUT`
    too; any other failure `EXIT_WRITE_FAILED`), and rank 0 prints `summary` of what
    it returned and the seconds it took. A rank working longer than `stall_s` without
    progress ends the job (`stall`).
    """
    error, inputs = None, None
    try:
        inputs = check()
    except bad_input as exc:
        error = str(exc)
    error = agree(comm, error)
    if error:
        say(comm, prog, f"error: {error}")
        return EXIT_BAD_INPUT
    start = time.perf_counter()
    failed: list[int] = []
    written = write_or_abort(prog, comm, lambda: write(inputs), failed,  # type: ignore[arg-type]
                             stall_s)
    if failed:
        return failed[0]
    if comm.rank == 0:
        summary(written, time.perf_counter() - start)  # type: ignore[arg-type]
    return 0


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
    bar = Progress(comm, f"{split}: {what}", blocks[-1].stop if blocks else 0, unit, prog)
    for i in mine:
        resumed = parts.done(split, i)
        if not resumed:
            parts.save(split, i, **read_block(i))
        bar.advance(len(blocks[i]), resumed)
    bar.close()


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
