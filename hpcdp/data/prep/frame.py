"""How every preparation recipe runs over ranks: the part that is not about its data.

The recipes (`hpcdp.data.prep.cli` for samples, `clicks_prep`, `markov_prep`,
`text_prep`) run on one process or under ``mpirun`` / ``srun --mpi=pmix`` and
share one discipline: every rank checks the input and the ranks agree on the
first error before any collective file operation, so bad input ends every rank
with the same message and nothing written; each file is written under a
temporary name and renamed once every rank is done (`replacing`), so a failed
run never replaces a good file; and a rank that fails mid-write aborts the job
instead of leaving the others waiting in a collective. `run` is that frame; the
rest are its parts (the world, its checks, messages, prefix sums, parallel HDF5
writes).
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import numpy as np

from hpcdp.runtime import hvd_settings

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
    environment first, as in training, since MPI reads them when mpi4py starts it.
    """
    try:
        hvd_settings.apply()
    except ValueError as exc:  # a malformed export: every rank fails alike, before MPI
        raise PrepError(str(exc)) from exc
    if not any(name in os.environ for name in MPI_MARKERS):
        return SerialComm()
    from mpi4py import MPI

    return MPI.COMM_WORLD


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


def check_outputs(out_dir: str, names: Sequence[str], overwrite: bool,
                  refusal: str = "--out {out}: {names} already exist; pass --overwrite to "
                                 "replace them") -> None:
    """The output folder is usable (made if missing), and none of `names` in it is replaced
    unless `overwrite`. `refusal` words the refusal from ``out``, ``names`` (those found,
    comma-separated) and ``first`` (the path of the first found)."""
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise PrepError(f"--out {out_dir}: exists and is not a folder")
    existing = [n for n in names if os.path.exists(os.path.join(out_dir, n))]
    if existing and not overwrite:
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
    return h5py.File(path, "w", driver="mpio", comm=comm)


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
        bad_input: tuple[type[BaseException], ...] = (PrepError, OSError, ImportError)) -> int:
    """Collective: a recipe from its checks to its summary; the exit status.

    `check` runs on every rank and raises one of `bad_input`; the ranks agree on
    the first error and all exit 1 with nothing written. Then `write_or_abort`
    runs `write`, and rank 0 prints `summary` of what it returned and the seconds
    it took.
    """
    error, inputs = None, None
    try:
        inputs = check()
    except bad_input as exc:
        error = str(exc)
    error = agree(comm, error)
    if error:
        say(comm, prog, f"error: {error}")
        return 1
    start = time.perf_counter()
    written = write_or_abort(prog, comm, lambda: write(inputs))  # type: ignore[arg-type]
    if written is None:
        return 1
    if comm.rank == 0:
        summary(written, time.perf_counter() - start)
    return 0


def write_or_abort(prog: str, comm: Any, write: Callable[[], Written]) -> Written | None:
    """Collective: what `write` returns, or None once its failure is reported.

    A `PrepError` from `write` must be raised on every rank alike, before any file
    is created (as after `agree`). Any other failure aborts the job: the other ranks
    may be waiting in a collective for the one that failed.
    """
    try:
        return write()
    except PrepError as exc:
        say(comm, prog, f"error: {exc}")
    except Exception as exc:  # noqa: BLE001 - a rank failing mid-write must not hang the others
        say(comm, prog, f"error while writing: {type(exc).__name__}: {exc}")
        if comm.size > 1:
            comm.Abort(1)
    return None


# -- placeholder of the agreed streaming write, until the frame's own is merged --------


def write_parts(path: str, parts: Any, split: str, blocks: range,
                datasets: Callable[[Any, int], dict[str, Any]], comm: Any,
                slab_rows: int) -> int:
    """Collective: the parts of `split` (this rank's `blocks`) into one new file at `path`."""
    mine = [(b, parts.rows(split, b)) for b in blocks]
    rows = dict(pair for got in comm.allgather(mine) for pair in got)
    order = sorted(rows)
    starts = dict(zip(order, np.cumsum([0, *[rows[b] for b in order]])[:-1].tolist()))
    total = int(sum(rows.values()))
    pieces = [(b, a) for b in blocks for a in range(0, rows[b], slab_rows)]
    rounds = max(comm.allgather(len(pieces)))
    with replacing(path, comm) as tmp, create_h5(tmp, comm) as f:
        dsets = datasets(f, total)
        for i in range(rounds):
            if i < len(pieces):
                b, a = pieces[i]
                arrays = parts.load(split, b)
                for name, dset in dsets.items():
                    data = np.asarray(arrays[name][a : a + slab_rows])
                    _write_rows(dset, starts[b] + a, data, comm)
                del arrays
            else:
                for dset in dsets.values():
                    _write_rows(dset, 0, np.zeros((0, *dset.shape[1:]), dset.dtype), comm)
    return total


def _write_rows(dset: Any, start: int, data: np.ndarray, comm: Any) -> None:
    if comm.size == 1:
        if len(data):
            dset[start : start + len(data)] = data
    else:
        mpio_write(dset, start, data, True)


class Progress:
    """Placeholder of the agreed progress report, until the frame's own is merged."""

    def __init__(self, comm: Any, what: str, total: int, unit: str) -> None:
        self.done = 0

    def advance(self, n: int) -> None:
        self.done += n

    def close(self) -> None:
        pass
