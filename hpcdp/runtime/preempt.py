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
from collections.abc import Callable, Mapping, Sequence
from types import FrameType

from hpcdp.runtime import watchdog

log = logging.getLogger("hpcdp.runtime.preempt")

# Exit statuses of a run that stopped at a checkpoint before its end, so that a job
# never reads COMPLETED (and starts its `afterok` dependents) on unfinished training.
# EXIT_REQUEUE: the job should be requeued and the ranks could not do it (no scontrol
# inside a container, say): the batch script requeues it. EXIT_STOPPED: unfinished, and
# not to be requeued (cancelled, preempt.requeue=false, preempt.max_requeues reached).
EXIT_REQUEUE = 75
EXIT_STOPPED = 76


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
    if fields.get("Requeue") == "0":
        return False, "the job was submitted with --no-requeue (Requeue=0)"
    if state in ("COMPLETING", "CANCELLED") and reason not in ("TimeLimit", "Preempted"):
        return False, f"job is being cancelled (JobState={state} Reason={reason or '?'})"
    return True, f"JobState={state} Reason={reason or '?'}"


def requeue_target(environ: Mapping[str, str]) -> str | None:
    """The id to requeue: this array task alone (`<array id>_<task id>`), else the job.

    The array's own id is also the JobId of one of its tasks, and `scontrol requeue`
    of that id requeues every task of the array.
    """
    array, task = environ.get("SLURM_ARRAY_JOB_ID"), environ.get("SLURM_ARRAY_TASK_ID")
    if array and task:
        return f"{array}_{task}"
    return environ.get("SLURM_JOB_ID") or None


def try_requeue(job_id: str, scontrol: str = "scontrol",
                timeout: float = 60.0) -> tuple[str, str]:
    """Ask Slurm to requeue `job_id` unless it must not be; (outcome, why).

    outcome: "requeued"; "refused" (cancelled by its user, or --no-requeue); or
    "failed" (no scontrol here, no answer, or Slurm said no). A rank whose watchdog
    reported a stall refuses: a stall is not a preemption, and a requeued job would
    only stall again on the same node or file system.
    """
    if watchdog.stalled():
        return "refused", "a stall was reported (see 'hpcdp stall:')"
    exe = shutil.which(scontrol)
    if exe is None:
        return "failed", f"{scontrol} not found"
    try:
        shown = subprocess.run([exe, "show", "job", "-o", str(job_id)], capture_output=True,
                               text=True, timeout=timeout, check=False)
        show = shown.stdout if shown.returncode == 0 else ""
    except subprocess.TimeoutExpired:
        show = ""
    wanted, why = requeue_wanted(show)
    if not wanted:
        return "refused", why
    try:
        done = subprocess.run([exe, "requeue", str(job_id)], capture_output=True, text=True,
                              timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return "failed", f"scontrol requeue {job_id} did not answer within {timeout:.0f}s"
    if done.returncode != 0:
        return "failed", (f"scontrol requeue {job_id} failed (exit {done.returncode}): "
                          f"{(done.stderr or done.stdout).strip()}")
    return "requeued", why


def requeue_job(job_id: str, scontrol: str = "scontrol", timeout: float = 60.0) -> bool:
    """try_requeue as a yes/no, the reason logged when no."""
    outcome, why = try_requeue(job_id, scontrol, timeout)
    if outcome != "requeued":
        log.warning("job %s not requeued: %s", job_id, why)
    return outcome == "requeued"


def stop_outcome(reason: str, requeue: bool, max_requeues: int,
                 environ: Mapping[str, str],
                 attempt: Callable[[str], tuple[str, str]] = try_requeue) -> tuple[str, int]:
    """After a stop at a checkpoint: (note for the log line, exit status); rank 0 only.

    A preempted run under Slurm requeues its job (`attempt`) unless preempt.requeue
    is off or the job was requeued max_requeues times already (a crash loop). It
    exits 0 only when requeued; EXIT_REQUEUE when a requeue is wanted but failed
    here, so the batch script makes it; EXIT_STOPPED otherwise. Outside Slurm, and
    for run.stop_at_step, there is nothing to requeue: exit 0, run again to resume.
    """
    job = requeue_target(environ)
    if reason != "preempted" or job is None:
        return "", 0
    if not requeue:
        return f", job {job} not requeued (preempt.requeue=false)", EXIT_STOPPED
    restarts = int(environ.get("SLURM_RESTART_COUNT") or 0)
    if restarts >= max_requeues:
        return (f", job {job} not requeued: requeued {restarts} time(s) already, "
                f"preempt.max_requeues={max_requeues}"), EXIT_STOPPED
    outcome, why = attempt(job)
    if outcome == "requeued":
        return f", requeued job {job}", 0
    if outcome == "refused":
        return f", job {job} not requeued: {why}", EXIT_STOPPED
    return (f", job {job} not requeued here ({why}); exit {EXIT_REQUEUE} asks the batch "
            "script to requeue it"), EXIT_REQUEUE


def after_stop(reason: str, root: bool, requeue: bool, max_requeues: int,
               environ: Mapping[str, str],
               share: Callable[[tuple[str, int] | None], tuple[str, int]]) -> tuple[str, int]:
    """Collective: rank 0's stop_outcome on every rank (`share` broadcasts from rank 0).

    Every rank exits with the same status, so srun reports that status, not a kill.
    """
    return share(stop_outcome(reason, requeue, max_requeues, environ) if root else None)
