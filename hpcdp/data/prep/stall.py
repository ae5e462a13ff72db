"""A bound on a preparation rank that stops making progress: the job ends, naming it.

A rank marks its progress where it finishes a unit of work (`mark`: a block, a batch of
documents, a slab written; `progress.Progress.advance` marks every block) and the waits it
does not control (`waiting`: a collective, which `Watched` marks on every rank; the BPE
trainer's child process). One thread per rank (`guarded`) wakes every second; when the
rank has been working, not waiting, for longer than the bound (``--stall-timeout``,
default `DEFAULT_BOUND_S`; 0 turns it off) since its last mark, it prints one line naming
the rank, its host, what it was doing and for how long, then the Python stack of each of
its threads, and aborts the job (MPI_Abort, exit status `EXIT_STALLED`): the other ranks,
waiting for it in a collective, end with it. The parts saved so far are kept, so the same
command with ``--resume`` continues.

Only working time counts because a rank waits in a collective for as long as the slowest
rank works, and that rank's own thread bounds it. Not bounded here: a rank stuck in a call
that holds the GIL (h5py, which does, in a hung file system) keeps this thread from
running; the job's time limit ends that one.
"""

from __future__ import annotations

import contextlib
import socket
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from hpcdp.runtime.watchdog import dump_stacks

#: Seconds a rank may work without finishing a unit (a block is seconds at 64 MiB).
DEFAULT_BOUND_S = 600.0
#: The guard thread's stack: a few frames deep, where the default (8 MiB) would be address
#: space reserved for nothing (it counts under `ulimit -v`). Its malloc arena cannot be
#: avoided: one more thread may reserve one more (64 MiB) unless MALLOC_ARENA_MAX says not.
STACK_BYTES = 512 << 10
#: The exit status of a job ended by a stalled rank.
EXIT_STALLED = 3
#: mpi4py's blocking collectives (lower case: Python objects; capitalised: buffers), and
#: the communicator constructors, which are collective too.
COLLECTIVES = frozenset({
    "allgather", "allreduce", "alltoall", "barrier", "bcast", "exscan", "gather", "reduce",
    "scan", "scatter", "Allgather", "Allgatherv", "Allreduce", "Alltoall", "Alltoallv",
    "Barrier", "Bcast", "Exscan", "Gather", "Gatherv", "Reduce", "Scan", "Scatter",
    "Scatterv", "Dup", "Split", "Split_type", "Create",
})


@dataclass
class Marks:
    """This rank's position: written by the main thread, read by the guard (each store is
    atomic under the GIL)."""

    doing: str = "starting"  # what the rank last said it does (a Progress's count)
    since: float = 0.0  # when the last unit of work ended (time.monotonic)
    waiting: str | None = None  # the wait it is in, if any


marks = Marks(since=time.monotonic())


def mark(doing: str | None = None) -> None:
    """A unit of work ended (and the next is `doing`, if said)."""
    marks.since = time.monotonic()
    if doing is not None:
        marks.doing = doing


@contextlib.contextmanager
def waiting(what: str) -> Iterator[None]:
    """A wait the rank does not control (not bounded here); leaving it is progress."""
    outer = marks.waiting
    marks.waiting = what
    try:
        yield
    finally:
        marks.waiting = outer
        marks.since = time.monotonic()


def overdue(state: Marks, now: float, bound_s: float) -> float | None:
    """Seconds worked since the last mark when over `bound_s` (pure), else None."""
    if bound_s <= 0 or state.waiting is not None:
        return None
    worked = now - state.since
    return worked if worked > bound_s else None


def report(prog: str, rank: int, host: str, doing: str, worked: float, bound_s: float) -> str:
    return (f"{prog}: stall: rank {rank} on {host}: {worked:.0f} s without progress "
            f"(--stall-timeout {bound_s:g}); its last: {doing}; its stack follows. Ending "
            "the job: the same command with --resume continues from the blocks saved")


class Watched:
    """`comm` with every blocking collective marked as a wait. Everything else is the
    communicator's own; `raw` is the communicator itself (for h5py's MPI-IO driver)."""

    def __init__(self, comm: Any) -> None:
        self.raw = comm

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.raw, name)
        if name not in COLLECTIVES:
            return attr

        def collective(*args: Any, **kwargs: Any) -> Any:
            with waiting(f"in {name}"):
                return attr(*args, **kwargs)

        return collective


def raw(comm: Any) -> Any:
    """The communicator under `Watched` (or `comm` itself)."""
    return getattr(comm, "raw", comm)


class Guard:
    """The thread that ends the job when this rank goes over the bound."""

    def __init__(self, comm: Any, prog: str, bound_s: float, tick_s: float = 1.0) -> None:
        self.comm, self.prog, self.bound_s, self.tick_s = comm, prog, bound_s, tick_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="hpcdp-prep-stall",
                                        daemon=True)

    def start(self) -> Guard:
        mark("working")
        previous = threading.stack_size(STACK_BYTES)  # for the threads started now: this one
        try:
            self._thread.start()
        finally:
            threading.stack_size(previous)
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _watch(self) -> None:
        while not self._stop.wait(self.tick_s):
            worked = overdue(marks, time.monotonic(), self.bound_s)
            if worked is not None:
                self._end(worked)
                return

    def _end(self, worked: float) -> None:
        print(report(self.prog, self.comm.rank, socket.gethostname(), marks.doing, worked,
                     self.bound_s), file=sys.stderr, flush=True)
        dump_stacks(sys.stderr)
        raw(self.comm).Abort(EXIT_STALLED)


@contextlib.contextmanager
def guarded(comm: Any, prog: str, bound_s: float) -> Iterator[None]:
    """The body under this rank's guard (none when `bound_s` is 0)."""
    if bound_s <= 0:
        yield
        return
    guard = Guard(comm, prog, bound_s).start()
    try:
        yield
    finally:
        guard.stop()
