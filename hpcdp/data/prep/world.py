"""The ranks a preparation runs on, and how they stay in step.

A recipe runs on one process (`SerialComm`) or under ``mpirun`` / ``srun --mpi=pmix``
(mpi4py's world, `world`). Every rank checks its inputs and the ranks agree on the first
error (`agree`, `raise_agreed`) before any collective file operation, so bad input
(`PrepError`) ends every rank with the same message; `say` words it, and `exscan` and
`allreduce` are the few sums the recipes need, the same on one rank as on many.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from hpcdp.data.prep import stall
from hpcdp.runtime import thread_plan

#: Environment variables that mean "started by an MPI launcher".
MPI_MARKERS = ("OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE", "MPI_LOCALNRANKS")


class PrepError(ValueError):
    """Bad preparation options (output folder, sizes, MPI setup)."""


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

    hpcdp's runtime settings (threads, MPI yielding: hpcdp.runtime.thread_plan) go into the
    environment first, as in training, since MPI reads them when mpi4py starts it. Its
    collectives count as waits for the stall bound (`stall.Watched`).
    """
    try:
        thread_plan.apply()
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
