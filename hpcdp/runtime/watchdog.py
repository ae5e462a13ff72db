"""Every rank's watchdog: what the rank is doing, its heartbeat, and the bounded stall.

The training loop marks its progress with calls that cost a few attribute stores
(no lock, no I/O): `beat(step)` at each step boundary, `phase(name)` at a few points
inside a step, `waiting(name)` around every collective hpcdp calls, `section(kind)`
when validation or a checkpoint begins.

One thread per rank (`start`) wakes every second. It rewrites the rank's heartbeat,
one fixed-width line in <run dir>/heartbeat/rank-NNNNN (step, collectives entered,
phase, time), and compares the time since the current interval began with the
bound (hpcdp.runtime.stall). At the bound it reads every rank's heartbeat and prints one
line `hpcdp stall: ...` naming the ranks that are behind and what they were doing,
then this rank's position and the Python stack of each of its threads; it marks
itself stalled in its heartbeat and in the folder's `stalled` file (the other
ranks' watchdogs see that and write their stacks too), waits GRACE_S for them, and
aborts the job. A rank whose main thread holds the GIL forever (a C call stuck on a
hung file system) starves this thread: faulthandler's C-level timer, re-armed on
every tick, then writes the stacks and ends the process.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import socket
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from hpcdp.runtime import faults, stall
from hpcdp.runtime.stall import CHECKPOINT, PREFIX, START, STEP, VALIDATION, Beat, StallRule

GRACE_S = 3.0  # after a stall is reported: time for the other ranks to write their stacks
BACKSTOP_S = 30.0  # faulthandler's timer fires this long after the bound, if nothing else did
STALE_S = 60.0  # heartbeats older than this before our start are from an earlier run

Hook = Callable[[str, int], None]


class Progress:
    """This rank's position. Written by the main thread, read by the watchdog thread.

    Each store is atomic under the GIL; `interval` is one tuple so that its kind and
    start are never read half-updated.
    """

    __slots__ = ("step", "entered", "phase", "interval", "slowest", "hook")

    def __init__(self) -> None:
        self.step = -1
        self.entered = 0  # collectives entered since the step began
        self.phase = START
        self.interval: tuple[str, float] = (START, time.monotonic())
        self.slowest: dict[str, float] = {}  # kind -> longest interval seen
        self.hook: Hook | None = None  # fault injection at phases (tests)

    def restart(self, now: float) -> None:
        self.step, self.entered, self.phase = -1, 0, START
        self.interval = (START, now)
        self.slowest = {}

    def close_interval(self, now: float, kind: str) -> None:
        """End the current interval (recording its length) and begin one of `kind`."""
        previous, since = self.interval
        took = now - since
        if took > self.slowest.get(previous, 0.0):
            self.slowest[previous] = took
        self.interval = (kind, now)


progress = Progress()


def beat(step: int) -> None:
    """Step `step` begins (the step boundary)."""
    p = progress
    p.close_interval(time.monotonic(), STEP)
    p.step, p.entered, p.phase = step, 0, "step start"


def phase(name: str) -> None:
    """The rank now does `name` (data, forward, backward, optimizer)."""
    p = progress
    p.phase = name
    if p.hook is not None:
        p.hook(name, p.step)


def section(kind: str) -> None:
    """A long section begins (validation or checkpoint): it is bounded on its own."""
    assert kind in (VALIDATION, CHECKPOINT), kind
    p = progress
    p.close_interval(time.monotonic(), kind)
    p.phase = kind
    if p.hook is not None:
        p.hook(kind, p.step)


def enter_collective(name: str) -> None:
    """The rank enters the collective `name` (every rank must reach it)."""
    p = progress
    if p.hook is not None:  # a fault "just before a collective" stalls before entering
        p.hook("collective", p.step)
    p.entered += 1
    p.phase = name


class waiting:  # noqa: N801 - used like a function: `with watchdog.waiting("allreduce x"):`
    """Around a collective: marks it entered, and left when it returns."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __enter__(self) -> None:
        enter_collective(self.name)

    def __exit__(self, *exc: object) -> None:
        progress.phase = f"after {self.name}"


def dump_stacks(out: TextIO) -> None:
    """Every thread's Python stack to `out`, in one write: faulthandler writes a line in
    many small pieces, and a launcher that tags each write (mpirun --tag-output) would
    split the lines. Through a temporary file, since faulthandler needs a descriptor."""
    try:
        with tempfile.TemporaryFile() as buffer:
            faulthandler.dump_traceback(file=buffer, all_threads=True)
            buffer.seek(0)
            text = buffer.read().decode(errors="replace")
    except (ValueError, OSError):  # no temporary file (a full disk): Python's own format
        text = "".join(f"Thread 0x{ident:x}:\n{''.join(traceback.format_stack(frame))}"
                       for ident, frame in sys._current_frames().items())
    out.write(text)
    out.flush()


def read_beats(folder: Path, size: int, not_before: float) -> dict[int, Beat]:
    """Every rank's heartbeat that can be read and is from this run."""
    beats: dict[int, Beat] = {}
    for rank in range(size):
        try:
            with (folder / beat_name(rank)).open("rb") as f:
                found = stall.parse_beat(f.read(stall.RECORD_BYTES))
        except OSError:
            continue
        if found is not None and found.time >= not_before:
            beats[rank] = found
    return beats


def _secs(seconds: float) -> str:
    return f"{seconds:.0f}" if seconds >= 10 else f"{seconds:.1f}"


def beat_name(rank: int) -> str:
    return f"rank-{rank:05d}"


class Watchdog:
    """The per-rank thread: heartbeats, the bound, the report and the abort."""

    def __init__(self, rule: StallRule, rank: int, size: int, folder: Path | None,
                 on_timeout: Callable[[], None], tick_s: float = 1.0,
                 grace_s: float = GRACE_S, backstop_s: float = BACKSTOP_S,
                 out: TextIO | None = None) -> None:
        self.rule, self.rank, self.size, self.folder = rule, rank, size, folder
        self.on_timeout = on_timeout
        self.tick_s, self.grace_s, self.backstop_s = tick_s, grace_s, backstop_s
        self.out = out
        self.fired = False
        self._fd: int | None = None
        self._host, self._pid = socket.gethostname(), os.getpid()
        self._started = time.time()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hpcdp-watchdog", daemon=True)

    def start(self) -> Watchdog:
        self._started = time.time()
        self._arm_backstop(self._bound()[1] + self.backstop_s)  # even if this thread never runs
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)
        self._cancel_backstop()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    # ------------------------------------------------------------------ the thread

    def _run(self) -> None:
        wait = min(self.tick_s, self._bound()[1] / 4)
        while not self._stop.wait(wait):
            kind, bound = self._bound()
            idle = time.monotonic() - progress.interval[1]
            self._write_beat(stalled=False)
            if idle > bound:
                self._fire(f"no progress for {_secs(idle)} s in {kind} (bound {_secs(bound)} "
                           f"s, {self.rule.describe()})")
                return
            if idle > bound / 2:
                peer = self._peer_fired()
                if peer is not None:
                    self._fire(f"rank {peer} reported a stall; this rank was idle "
                               f"{_secs(idle)} s")
                    return
            self._arm_backstop(bound - idle + self.backstop_s)
            wait = min(self.tick_s, bound / 4)

    def _bound(self) -> tuple[str, float]:
        kind = progress.interval[0]
        return kind, stall.bound_s(self.rule, kind, progress.slowest)

    def _fire(self, reason: str) -> None:
        global _stalled
        _stalled = True
        self.fired = True
        self._arm_backstop(self.grace_s + self.backstop_s)  # should anything below hang
        self._write_beat(stalled=True)
        self._mark_stalled()
        out = self.out or sys.stderr
        if stall.reporters(self.size) is None or self.rank in stall.reporters(self.size):
            out.write(f"{PREFIX} {self._report()} [seen by rank {self.rank}: {reason}; "
                      "aborting the job]\n")
        p = progress
        out.write(f"[hpcdp rank {self.rank}] stalled at step {p.step} in {p.phase} "
                  f"({p.entered} collective(s) entered in this step); every thread's stack "
                  "follows\n")
        dump_stacks(out)
        time.sleep(self.grace_s)
        self.on_timeout()
        self._cancel_backstop()  # only reached when on_timeout returns (tests)

    def _report(self) -> str:
        beats: dict[int, Beat] = {}
        if self.folder is not None:
            beats = read_beats(self.folder, self.size, self._started - STALE_S)
        beats[self.rank] = self._beat(stalled=True)
        return stall.report(beats, self.size, time.time())

    # ------------------------------------------------------------------ files

    def _beat(self, stalled: bool) -> Beat:
        p = progress
        return Beat(p.step, p.entered, time.time(), stalled, self._host, self._pid, p.phase)

    def _write_beat(self, stalled: bool) -> None:
        """Rewrite this rank's heartbeat in place; never fails the run.

        Only from the first step on: a run refused during setup (bad data, a checkpoint
        of another model) must leave an existing run folder as it found it.
        """
        if self.folder is None or progress.step < 0:
            return
        try:
            if self._fd is None:
                self.folder.mkdir(exist_ok=True)  # the run dir is made by rank 0: wait for it
                if self.rank == 0:  # an earlier run's stall mark must not end this one
                    (self.folder / "stalled").unlink(missing_ok=True)
                self._fd = os.open(self.folder / beat_name(self.rank), os.O_WRONLY | os.O_CREAT,
                                   0o644)
            os.pwrite(self._fd, stall.format_beat(self._beat(stalled)), 0)
        except OSError:
            pass

    def _mark_stalled(self) -> None:
        if self.folder is None or progress.step < 0:
            return
        try:
            fd = os.open(self.folder / "stalled", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except OSError:
            return  # another rank was first, or no folder
        os.write(fd, f"{self.rank}\n".encode())
        os.close(fd)

    def _peer_fired(self) -> int | None:
        if self.folder is None:
            return None
        try:
            text = (self.folder / "stalled").read_text()
            if os.stat(self.folder / "stalled").st_mtime < self._started - STALE_S:
                return None
        except OSError:
            return None
        return int(text) if text.strip().isdigit() else -1

    # ------------------------------------------------------------------ the backstop

    def _arm_backstop(self, seconds: float) -> None:
        with contextlib.suppress(AttributeError, ValueError, OSError):  # no fileno
            faulthandler.dump_traceback_later(max(1.0, seconds), exit=True,
                                              file=self.out or sys.stderr)

    def _cancel_backstop(self) -> None:
        faulthandler.cancel_dump_traceback_later()


_current: Watchdog | None = None
_stalled = False


def rule_of(run: Any) -> StallRule:
    """The bound's keys of a RunConfig."""
    return StallRule(run.step_timeout_s, run.stall_floor_s, run.stall_multiple,
                     run.stall_warmup_factor)


def start(run: Any, rank: int, size: int, run_dir: Path,
          on_timeout: Callable[[], None]) -> Watchdog | None:
    """This rank's watchdog for a run (None when run.step_timeout_s = 0), from now on.

    Also arms the faults that HPCDP_FAULT places at phases (tests).
    """
    global _current
    progress.restart(time.monotonic())
    progress.hook = faults.phase_hook(rank)
    rule = rule_of(run)
    if not rule.enabled:
        return None
    _current = Watchdog(rule, rank, size, run_dir / "heartbeat", on_timeout).start()
    return _current


def stop() -> None:
    """Stop this process's watchdog, if one runs (the run ended, cleanly or agreed)."""
    global _current
    if _current is not None:
        _current.stop()
        _current = None


def stalled() -> bool:
    """Whether this process's watchdog reported a stall (the job is being aborted)."""
    return _stalled
