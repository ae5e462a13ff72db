"""Preemption: a signal asks the job to checkpoint, requeue itself and stop.

A signal sets a flag on whichever rank got it, possibly at different steps on
different ranks. At step boundaries all ranks combine their flags with a max
all-reduce on the same schedule, so they all stop after the same step. The
training loop uses the lagged form: each check reads the all-reduce started at
the previous check (finished long since, behind a step's compute) and starts
the next, so agreeing costs no wait at all, and a signal is acted on one check
later. The reduction is passed in, which keeps this module free of Horovod and
testable.
"""

from __future__ import annotations

import logging
import shutil
import signal
import subprocess
from collections.abc import Callable, Sequence
from types import FrameType

log = logging.getLogger("hpcdp.preempt")


def signal_number(name: str) -> signal.Signals:
    """'USR1' or 'SIGUSR1' -> signal.SIGUSR1."""
    key = name.upper()
    key = key if key.startswith("SIG") else f"SIG{key}"
    try:
        return signal.Signals[key]
    except KeyError:
        raise ValueError(f"unknown signal {name!r}") from None


class Preemption:
    """Signal handlers that only set a flag, plus the agreed check at step boundaries."""

    def __init__(self, signals: Sequence[str], check_every: int = 1) -> None:
        if check_every < 1:
            raise ValueError(f"check_every must be at least 1, got {check_every}")
        self.signals = [signal_number(s) for s in signals]
        self.check_every = check_every
        self.received: int | None = None
        self._previous: dict[signal.Signals, object] = {}
        self._pending: Callable[[], int] | None = None

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        # Only set the flag: the loop acts at the next agreed step boundary.
        self.received = signum

    def install(self) -> Preemption:
        for sig in self.signals:
            self._previous[sig] = signal.signal(sig, self._handler)
        return self

    def uninstall(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)  # type: ignore[arg-type]
        self._previous.clear()

    @property
    def requested(self) -> bool:
        return self.received is not None

    def due(self, step: int) -> bool:
        """Whether `step` is a step at which all ranks check (same on every rank)."""
        return step % self.check_every == 0

    def agreed_lagged(self, step: int, start_max: Callable[[int], Callable[[], int]]) -> bool:
        """Collective on due steps, one check behind: True on every rank alike.

        `start_max(flag)` starts a max all-reduce and returns a function that waits
        for its result. On a due step the previous check's result is read first (one
        such reduction in flight at a time), then this step's flag is sent.
        """
        if not self.due(step):
            return False
        previous, self._pending = self._pending, None
        stop = previous is not None and previous() > 0
        self._pending = start_max(1 if self.requested else 0)
        return stop

    def drain(self) -> None:
        """Wait for the reduction still in flight, if any (every rank, at the loop's end)."""
        previous, self._pending = self._pending, None
        if previous is not None:
            previous()


def job_fields(show: str) -> dict[str, str]:
    """`scontrol show job -o` output -> {"JobState": ..., "Reason": ...} (first word each)."""
    fields: dict[str, str] = {}
    for word in show.split():
        key, sep, value = word.partition("=")
        if sep and key not in fields:
            fields[key] = value
    return fields


def requeue_wanted(show: str) -> tuple[bool, str]:
    """Whether a job that stopped on a signal should requeue itself, and why (pure).

    What the ranks see in `scontrol show job -o`: a user's `scancel` reads
    `JobState=COMPLETING Reason=None`, a time limit `COMPLETING Reason=TimeLimit`,
    a `--signal=USR1` warning `RUNNING`. A job being ended by anything but its time
    limit or preemption was cancelled and must stay cancelled. An unreadable record
    requeues (the signal most likely was the preemption warning it is meant for).
    """
    fields = job_fields(show)
    state, reason = fields.get("JobState", ""), fields.get("Reason", "")
    if not state:
        return True, "job state unknown"
    if state in ("COMPLETING", "CANCELLED") and reason not in ("TimeLimit", "Preempted"):
        return False, f"job is being cancelled (JobState={state} Reason={reason or '?'})"
    return True, f"JobState={state} Reason={reason or '?'}"


def requeue_job(job_id: str, scontrol: str = "scontrol", timeout: float = 60.0) -> bool:
    """Ask Slurm to requeue `job_id`, unless its user cancelled it; True if requeued.

    False (logged) when the job was cancelled, the requeue failed, or this rank's
    watchdog reported a stall: a stall is not a preemption, and a requeued job would
    only stall again on the same node or file system.
    """
    from hpcdp import watchdog

    if watchdog.stalled():
        log.warning("not requeueing job %s: a stall was reported (see 'hpcdp stall:')", job_id)
        return False
    exe = shutil.which(scontrol)
    if exe is None:
        log.warning("cannot requeue job %s: %s not found", job_id, scontrol)
        return False
    try:
        shown = subprocess.run([exe, "show", "job", "-o", str(job_id)], capture_output=True,
                               text=True, timeout=timeout, check=False)
        show = shown.stdout if shown.returncode == 0 else ""
    except subprocess.TimeoutExpired:
        show = ""
    wanted, why = requeue_wanted(show)
    if not wanted:
        log.warning("not requeueing job %s: %s", job_id, why)
        return False
    try:
        done = subprocess.run([exe, "requeue", str(job_id)], capture_output=True, text=True,
                              timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        log.warning("scontrol requeue %s did not answer within %.0fs", job_id, timeout)
        return False
    if done.returncode != 0:
        log.warning("scontrol requeue %s failed (exit %d): %s", job_id, done.returncode,
                    (done.stderr or done.stdout).strip())
        return False
    return True
