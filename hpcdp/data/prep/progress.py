"""What rank 0 says about every rank's progress: done/total, the rate and the time left."""

from __future__ import annotations

import sys
import time
from typing import Any

from hpcdp.data.prep import stall


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
