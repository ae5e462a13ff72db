"""How every preparation recipe runs over ranks: the part that is not about its data.

The recipes run on one process or under ``mpirun`` / ``srun --mpi=pmix`` and share one
discipline: every rank checks the input and the ranks agree on the first error before any
collective file operation, so bad input ends every rank with the same message, exit status
`EXIT_BAD_INPUT` and nothing written; the input is cut into blocks (`blocks`) that each
rank turns into per-block parts (`parts`), so memory is bounded by a block and a killed run
resumes from its completed blocks; the final files are written from the parts in block
order (`write_parts`, prefix sums of the rows per block), each under a temporary name
renamed once every rank is done (`replacing`), so a failed run (`EXIT_WRITE_FAILED`) never
replaces a good file; a rank that fails mid-write aborts the job instead of leaving the
others waiting in a collective; rank 0 reports progress (`Progress`). `run` is that frame;
the rest are its parts (the world, its checks, messages, prefix sums, parallel HDF5
writes, the options every recipe shares).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from hpcdp import __version__
from hpcdp.data.prep import stall
from hpcdp.data.prep.blocks import DEFAULT_BLOCK_BYTES
from hpcdp.runtime import hvd_settings

#: Exit statuses of every recipe: bad input (every rank says why; nothing written), and a
#: failure while writing (the files already there are kept).
EXIT_BAD_INPUT = 2
EXIT_WRITE_FAILED = 1

#: The work folder of a preparation in progress, inside its output folder (`parts`).
WORK_DIR = ".hpcdp-prep"
#: Environment variables that mean "started by an MPI launcher".
MPI_MARKERS = ("OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE", "MPI_LOCALNRANKS")

Inputs = TypeVar("Inputs")
Written = TypeVar("Written")


class PrepError(ValueError):
    """Bad preparation options (output folder, sizes, MPI setup)."""


# -- the world ------------------------------------------------------------------------


class SerialComm:
    """The one-process world, with the few collectives preparation uses."""

    rank = 0
    size = 1

    def allgather(self, value: Any) -> list[Any]:
        return [value]

    def bcast(self, value: Any, root: int = 0) -> Any:
        return value

    def gather(self, value: Any, root: int = 0) -> list[Any]:
        return [value]

    def Barrier(self) -> None:  # noqa: N802 - mpi4py's name
        pass

    def Abort(self, code: int = 1) -> None:  # noqa: N802 - mpi4py's name
        os._exit(code)


def world() -> Any:
    """mpi4py's COMM_WORLD when started by an MPI launcher (mpirun, srun --mpi=...), else serial.

    hpcdp's runtime settings (threads, MPI yielding: hpcdp.runtime.hvd_settings) go into the
    environment first, as in training, since MPI reads them when mpi4py starts it. Its
    collectives count as waits for the stall bound (`stall.Watched`).
    """
    try:
        hvd_settings.apply()
    except ValueError as exc:  # a malformed export: every rank fails alike, before MPI
        raise PrepError(str(exc)) from exc
    if not any(name in os.environ for name in MPI_MARKERS):
        return SerialComm()
    from mpi4py import MPI

    return stall.Watched(MPI.COMM_WORLD)


def check_world(size: int) -> None:
    """Several Slurm tasks must see several MPI ranks, and several ranks a parallel h5py."""
    tasks = int(os.environ.get("SLURM_STEP_NUM_TASKS", "1") or 1)
    if size == 1 and tasks > 1:
        raise PrepError(
            f"started as {tasks} Slurm tasks but MPI sees one rank: use srun --mpi=pmix"
        )
    if size > 1:
        import h5py

        if not h5py.get_config().mpi:
            raise PrepError("this h5py is built without MPI; several ranks cannot share one file")


def agree(comm: Any, error: str | None) -> str | None:
    """Collective: the first rank's error (in rank order), the same on every rank."""
    errors = [e for e in comm.allgather(error) if e]
    return errors[0] if errors else None


def raise_agreed(comm: Any, error: str | None, kind: type[PrepError] = PrepError) -> None:
    """Collective: raise the first rank's error (`agree`) on every rank, so that all stop
    together; return when no rank has one."""
    error = agree(comm, error)
    if error:
        raise kind(error)


def wait_quietly(comm: Any, poll_seconds: float = 0.05) -> None:
    """Collective: a barrier that sleeps between polls instead of spinning: for ranks
    waiting while one rank works on all of its node's cores (a library's threads), which
    an MPI barrier's busy polling would take a core from."""
    if comm.size == 1:
        return
    request = comm.Ibarrier()
    with stall.waiting("in a barrier (rank 0 training the BPE)"):
        while not request.Test():
            time.sleep(poll_seconds)


def say(comm: Any, prog: str, message: str) -> None:
    """`message` on stderr, prefixed by the rank when there are several."""
    prefix = f"[rank {comm.rank}] " if comm.size > 1 else ""
    print(f"{prefix}{prog}: {message}", file=sys.stderr, flush=True)


def exscan(comm: Any, value: int) -> int:
    """Collective: the sum of `value` over the ranks before this one (0 on rank 0)."""
    if comm.size == 1:
        return 0
    got = comm.exscan(value)
    return 0 if got is None or comm.rank == 0 else int(got)


def allreduce(comm: Any, value: int, op: str = "sum") -> int:
    """Collective: the sum (or with ``op="max"`` the largest) of `value` over the ranks."""
    if comm.size == 1:
        return value
    from mpi4py import MPI

    return int(comm.allreduce(value, op=MPI.MAX if op == "max" else MPI.SUM))


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


@contextmanager
def replacing(final: str, comm: Any) -> Iterator[str]:
    """Collective: a temporary name beside `final` that every rank writes to; once all
    are done, rank 0 renames it over `final`, so a failed write never replaces a good
    file. On a failure one rank removes it; with several the job is aborted and a stale
    temporary may remain."""
    folder, name = os.path.split(final)
    token = comm.bcast(uuid.uuid4().hex[:12] if comm.rank == 0 else None, root=0)
    tmp = os.path.join(folder, f".{name}.tmp-{token}")
    try:
        yield tmp
    except BaseException:
        if comm.size == 1 and os.path.exists(tmp):
            os.remove(tmp)
        raise
    comm.Barrier()
    if comm.rank == 0:
        os.replace(tmp, final)
    comm.Barrier()


def create_h5(path: str, comm: Any) -> Any:
    """Collective: a new HDF5 file, through MPI-IO (driver ``mpio``) when there are several
    ranks."""
    import h5py

    if comm.size == 1:
        return h5py.File(path, "w")
    return h5py.File(path, "w", driver="mpio", comm=stall.raw(comm))


def mpio_write(dset: Any, start: int, data: np.ndarray, collective: bool) -> None:
    """Write rows ``[start, start+len(data))``; every rank calls, zero rows included."""
    from h5py import h5fd, h5p, h5s

    dxpl = h5p.create(h5p.DATASET_XFER)
    dxpl.set_dxpl_mpio(h5fd.MPIO_COLLECTIVE if collective else h5fd.MPIO_INDEPENDENT)
    fspace = dset.id.get_space()
    tail = tuple(dset.shape[1:])
    if len(data):
        fspace.select_hyperslab((start,) + (0,) * len(tail), (len(data), *tail))
        mspace = h5s.create_simple(data.shape)
    else:
        fspace.select_none()
        data = np.zeros((1, *tail), dset.dtype)
        mspace = h5s.create_simple(data.shape)
        mspace.select_none()
    dset.id.write(mspace, fspace, np.ascontiguousarray(data, dset.dtype), dxpl=dxpl)


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


# -- the streaming frame: parts to one file, progress, common options --------------------


@dataclass(frozen=True)
class PartLayout:
    """Where every block's arrays go in a split's file: the same on every rank."""

    starts: dict[int, dict[str, int]]  # block -> array -> its first row in the file
    totals: dict[str, int]  # array -> rows in the file


def root_attrs(schema: dict[str, Any], num_samples: int, source: str, split: str,
               params: dict[str, Any], seed: int | None = None,
               more: dict[str, Any] | None = None) -> dict[str, Any]:
    """The root attributes of a prepared file, in this order: what it holds (`schema`: each
    dataset's shape and dtype), its rows, the recipe (`source`) and split, the seed where
    the recipe has one, what it was made from (`params`, as ``source_params``) and hpcdp's
    version; then the recipe's own (`more`)."""
    attrs: dict[str, Any] = {"schema": json.dumps(schema), "num_samples": num_samples,
                             "source": source, "split": split}
    if seed is not None:
        attrs["seed"] = seed
    return {**attrs, "source_params": json.dumps(params, sort_keys=True),
            "hpcdp_version": __version__, **(more or {})}


def part_layout(parts: Any, split: str, blocks: range, comm: Any) -> PartLayout:
    """Collective: each array's rows per block all-gathered, their prefix sums in block order
    (so the same file on any number of ranks) and the totals."""
    mine = [(i, parts.lengths(split, i)) for i in blocks]
    every = dict(kv for got in comm.allgather(mine) for kv in got)
    if sorted(every) != list(range(len(every))):
        raise RuntimeError(f"{split}: the ranks' blocks are not 0..{len(every) - 1}")
    names = list(every[0]) if every else []
    starts: dict[int, dict[str, int]] = {}
    at = dict.fromkeys(names, 0)
    for i in range(len(every)):
        starts[i] = dict(at)
        for name in names:
            at[name] += every[i][name]
    return PartLayout(starts, at)


def write_parts(path: str, parts: Any, split: str, blocks: range,
                datasets: Callable[[Any, int], dict[str, Any]], comm: Any, slab_rows: int,
                serial: bool = False, progress: Progress | None = None,
                layout: PartLayout | None = None,
                shift: dict[str, tuple[str, int]] | None = None,
                collective: bool = False) -> int:
    """Collective: ``path`` from every rank's parts of `split` (this rank's: `blocks`), the
    blocks' rows in block order; the total rows (of the parts' first array).

    Rows per block are all-gathered and each block's first row is their prefix sum
    (`part_layout`, or `layout` when the recipe made it first to size its datasets), so the
    file is the same for any number of ranks. ``datasets(f, total_rows)`` creates the
    datasets (and attributes) in the new file, each filled from the part array of its name
    (arrays of other names stay in the parts); each rank copies its blocks to their rows in
    slabs of at most `slab_rows`, every rank making the same number of writes. `shift`
    maps an array to (another array, rows left above it): its values are offsets into the
    other (document ends into tokens) and get that array's start in the block added, and
    its rows start that many rows lower (a leading 0 the callback writes). With `serial`
    (filtered datasets, which parallel HDF5 cannot write reliably) rank 0 opens the file
    alone and copies every rank's parts. The file is written under a temporary name and
    renamed when complete (`replacing`).
    """
    layout = layout or part_layout(parts, split, blocks, comm)
    shift = shift or {}
    first = next(iter(layout.totals), "")
    with replacing(path, comm) as tmp:
        if comm.size == 1 or serial:
            if comm.rank == 0:
                import h5py

                with h5py.File(tmp, "w") as f:
                    dsets = datasets(f, layout.totals.get(first, 0))
                    for read in _slabs(parts, split, range(len(layout.starts)), slab_rows):
                        _put(dsets, read, layout, shift, progress, first, None)
        else:
            with create_h5(tmp, comm) as f:
                dsets = datasets(f, layout.totals.get(first, 0))
                mine = list(_slabs(parts, split, blocks, slab_rows))
                rounds = allreduce(comm, len(mine), op="max")
                for k in range(rounds):  # every rank writes every round, some nothing
                    read = mine[k] if k < len(mine) else None
                    _put(dsets, read, layout, shift, progress, first, collective)
    return layout.totals.get(first, 0)


def _slabs(parts: Any, split: str, blocks: Sequence[int], slab_rows: int
           ) -> Iterator[Callable[[], tuple[int, int, dict[str, np.ndarray]]]]:
    """For each slab of `blocks`' parts, a function reading it: (block, first row in the
    block, {array: its rows of the slab}); the slabs are counted before anything is read."""
    for i in blocks:
        n = max(parts.lengths(split, i).values(), default=0)
        for a in range(0, n, max(1, slab_rows)):

            def read(i: int = i, a: int = a) -> tuple[int, int, dict[str, np.ndarray]]:
                part = parts.load(split, i)
                return i, a, {k: np.asarray(v[a : a + slab_rows]) for k, v in part.items()}

            yield read


def _put(dsets: dict[str, Any], read: Callable[[], Any] | None, layout: PartLayout,
         shift: dict[str, tuple[str, int]], progress: Progress | None, first: str,
         collective: bool | None) -> None:
    """One slab into every dataset: plain writes (`collective` None) or one MPI-IO write per
    dataset, empty when `read` is None (this rank has no slab left this round)."""
    block, a, data = read() if read is not None else (0, 0, {})
    for name, dset in dsets.items():
        rows = data.get(name, np.zeros((0, *dset.shape[1:]), dset.dtype))
        at = layout.starts[block][name] + a if data else 0
        if name in shift and data:
            base, skip = shift[name]
            rows = rows + layout.starts[block][base]
            at += skip
        if collective is None:
            if len(rows):
                dset[at : at + len(rows)] = rows
        else:
            mpio_write(dset, at, rows, collective)
    stall.mark()
    if progress is not None and data:
        progress.advance(len(data[first]))


def resume_note(comm: Any, prog: str, parts: Any, split: str, blocks: range) -> None:
    """Collective: in a resumed run, rank 0 says how many of `split`'s blocks were done."""
    if not parts.resumed:
        return
    done = allreduce(comm, sum(parts.done(split, i) for i in blocks))
    total = allreduce(comm, len(blocks))
    if comm.rank == 0:
        print(f"{prog}: {split}: resuming: {done} of {total} blocks already done",
              file=sys.stderr, flush=True)


def save_blocks(comm: Any, prog: str, parts: Any, split: str, blocks: Sequence[range],
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


class Progress:
    """Rank 0 reports how far every rank got: done/total, the rate and the time left.

    On a terminal a tqdm bar; otherwise (a Slurm log) a plain line on stderr at most every
    `every` seconds, and one at the end. The other ranks send their counts to rank 0 at
    most once a second (non-blocking point-to-point on a private communicator, so never a
    collective in the middle of the work); making and closing a Progress are collective.
    """

    _COUNT, _DONE = 1, 2

    def __init__(self, comm: Any, what: str, total: int, unit: str, prog: str = "hpcdp prep",
                 every: float = 10.0, stream: Any = None) -> None:
        self.comm, self.what, self.total, self.unit = comm, what, int(total), unit
        self.prog, self.every = prog, every
        self.stream = stream if stream is not None else sys.stderr
        self.mine = (0, 0)  # units done, and of them those an earlier run did (resumed)
        self.counts = [(0, 0)] * comm.size
        self.start = time.monotonic()
        self._said = self._sent = self.start
        self._reqs: list[Any] = []
        self._p2p = comm.Dup() if comm.size > 1 else None
        stall.mark(f"{what}: starting")
        self._bar = None
        if comm.rank == 0 and _isatty(self.stream):
            from tqdm import tqdm

            self._bar = tqdm(total=self.total or None, desc=what, unit=unit, unit_scale=True,
                             file=self.stream, dynamic_ncols=True)

    @property
    def done(self) -> int:
        """Rank 0: the units every rank reported done so far."""
        return sum(done for done, _ in self.counts)

    def advance(self, n: int, resumed: bool = False) -> None:
        """This rank did `n` more units (rows, files, bytes); `resumed`: an earlier run did
        them (they count as done, not toward the rate)."""
        self.mine = (self.mine[0] + int(n), self.mine[1] + (int(n) if resumed else 0))
        stall.mark(f"{self.what}: {self.mine[0]} {self.unit} done")
        now = time.monotonic()
        if self.comm.rank != 0:
            if now - self._sent >= 1.0:
                self._reqs = [r for r in self._reqs if not r.Test()]
                self._reqs.append(self._p2p.isend(self.mine, dest=0, tag=self._COUNT))
                self._sent = now
            return
        self.counts[0] = self.mine
        self._receive()
        self._show(now)

    def _receive(self) -> None:
        if self._p2p is None:
            return
        from mpi4py import MPI

        status = MPI.Status()
        while self._p2p.iprobe(source=MPI.ANY_SOURCE, tag=self._COUNT, status=status):
            source = status.Get_source()
            self.counts[source] = max(self.counts[source],
                                      tuple(self._p2p.recv(source=source, tag=self._COUNT)))

    def _show(self, now: float, final: bool = False) -> None:
        if self._bar is not None:
            self._bar.update(self.done - self._bar.n)
            return
        if final or now - self._said >= self.every:
            print(self.line(now), file=self.stream, flush=True)
            self._said = now

    def line(self, now: float | None = None) -> str:
        """The plain report: what, done/total (percent), rate, time left."""
        seconds = max(1e-9, (time.monotonic() if now is None else now) - self.start)
        done = self.done
        rate = (done - sum(resumed for _, resumed in self.counts)) / seconds
        text = f"{self.prog}: {self.what}: {_count(done)}"
        if self.total:
            text += f"/{_count(self.total)} {self.unit} ({100 * done / self.total:.0f}%)"
        else:
            text += f" {self.unit}"
        text += f", {_count(rate)} {self.unit}/s"
        if self.total and rate > 0 and done < self.total:
            text += f", {_duration((self.total - done) / rate)} left"
        elif done >= self.total:
            text += f", {_duration(seconds)} in all"
        return text

    def close(self) -> None:
        """Collective: rank 0 gathers every rank's final count and says the last line."""
        if self._p2p is not None:
            from mpi4py import MPI

            with stall.waiting(f"closing the progress of {self.what}"):  # for every rank
                if self.comm.rank != 0:
                    self._reqs.append(self._p2p.isend(self.mine, dest=0, tag=self._DONE))
                    MPI.Request.Waitall(self._reqs)
                else:
                    self._drain(MPI)
            self._p2p.Free()
            self._p2p = None
        if self.comm.rank == 0:
            self.counts[0] = self.mine
            if self._bar is not None:
                self._bar.update(self.done - self._bar.n)
                self._bar.close()
            else:
                self._show(time.monotonic(), final=True)

    def _drain(self, mpi: Any) -> None:
        """Rank 0: every message up to each rank's last (one pair's messages keep order)."""
        waiting = set(range(1, self.comm.size))
        status = mpi.Status()
        while waiting:
            got = self._p2p.recv(source=mpi.ANY_SOURCE, tag=mpi.ANY_TAG, status=status)
            source = status.Get_source()
            self.counts[source] = max(self.counts[source], tuple(got))
            if status.Get_tag() == self._DONE:
                waiting.discard(source)


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def _count(n: float) -> str:
    """1234 -> '1234', 12345 -> '12.3k', 12345678 -> '12.3M'."""
    for scale, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e4, "k")):
        if n >= scale:
            return f"{n / (1e3 if suffix == 'k' else scale):.1f}{suffix}"
    return f"{n:.0f}"


def _duration(seconds: float) -> str:
    """Seconds as '42 s', '3 min 5 s' or '2 h 14 min'."""
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60} min"
