"""Preemption at its edges: every signal handled, handlers restored, requeue's messages.

Each test pins down a behaviour that mutation testing (`make mutate`) found
unguarded. The requeue tests run a real `scontrol` stand-in (a shell script).
"""

from __future__ import annotations

import inspect
import logging
import os
import signal
import time
from pathlib import Path

import pytest

from hpcdp.runtime import watchdog
from hpcdp.runtime.preempt import Preemption, requeue_job, requeue_target, requeue_wanted

SIGNALS = ("USR1", "TERM", "USR2")


@pytest.fixture(autouse=True)
def no_stall(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stall reported by an earlier test in this process would block every requeue."""
    monkeypatch.setattr(watchdog, "_stalled", False)


def test_every_signal_gets_the_handler_and_gets_its_own_back() -> None:
    def before(signum: int, frame: object) -> None:  # a handler installed earlier
        pass

    previous = {name: signal.signal(signal.Signals[f"SIG{name}"], before) for name in SIGNALS}
    try:
        p = Preemption(list(SIGNALS)).install()
        for name in SIGNALS:
            assert signal.getsignal(signal.Signals[f"SIG{name}"]) == p._handler, name
        os.kill(os.getpid(), signal.SIGUSR2)  # the last one listed
        assert p.received == signal.SIGUSR2
        p.uninstall()
        for name in SIGNALS:
            assert signal.getsignal(signal.Signals[f"SIG{name}"]) is before, name
    finally:
        for name, handler in previous.items():
            signal.signal(signal.Signals[f"SIG{name}"], handler)


def test_check_every_defaults_to_each_step_and_refuses_zero() -> None:
    p = Preemption(["USR1"])
    assert p.check_every == 1 and all(p.due(step) for step in range(5))
    with pytest.raises(ValueError, match="check_every must be at least 1, got 0"):
        Preemption(["USR1"], check_every=0)


@pytest.mark.parametrize(
    ("show", "why"),
    [
        ("", "job state unknown"),
        ("JobId=7 Reason=None", "job state unknown"),
        ("JobId=7 JobState=COMPLETING", "job is being cancelled (JobState=COMPLETING Reason=?)"),
        ("JobId=7 JobState=CANCELLED Reason=None",
         "job is being cancelled (JobState=CANCELLED Reason=None)"),
        ("JobId=7 JobState=RUNNING", "JobState=RUNNING Reason=?"),
        ("JobId=7 JobState=COMPLETING Reason=TimeLimit", "JobState=COMPLETING Reason=TimeLimit"),
    ],
)
def test_requeue_reasons_in_full(show: str, why: str) -> None:
    assert requeue_wanted(show)[1] == why


def fake_scontrol(folder: Path, show: str = "", show_exit: int = 0, show_sleep: float = 0,
                  requeue: str = "exit 0") -> Path:
    """A `scontrol` that answers `show job` with `show` and runs `requeue` for a requeue."""
    exe = folder / "scontrol"
    exe.write_text(
        "#!/bin/sh\n"
        f"echo \"$@\" >> {folder / 'calls'}\n"
        f"if [ \"$1\" = show ]; then sleep {show_sleep}; echo '{show}'; exit {show_exit}; fi\n"
        f"{requeue}\n")
    exe.chmod(0o755)
    return exe


def calls(folder: Path) -> list[str]:
    return (folder / "calls").read_text().splitlines()


def test_requeue_finds_scontrol_on_the_path(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    fake_scontrol(tmp_path, show="JobId=5 JobState=RUNNING")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert requeue_job("5") is True
    assert calls(tmp_path) == ["show job -o 5", "requeue 5"]
    assert inspect.signature(requeue_job).parameters["timeout"].default == 60.0


def test_requeue_without_scontrol_names_both(tmp_path: Path,
                                             caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="hpcdp.runtime.preempt"):
        assert requeue_job("5", scontrol=str(tmp_path / "none")) is False
    assert caplog.messages == [f"job 5 not requeued: {tmp_path / 'none'} not found"]


def test_unreadable_job_record_still_requeues(tmp_path: Path) -> None:
    """`show` failing (its output ignored) or not answering: the signal was most likely
    the preemption warning, so the job requeues."""
    exe = fake_scontrol(tmp_path, show="JobId=5 JobState=CANCELLED Reason=None", show_exit=1)
    assert requeue_job("5", scontrol=str(exe)) is True
    assert calls(tmp_path) == ["show job -o 5", "requeue 5"]
    (tmp_path / "calls").unlink()
    exe = fake_scontrol(tmp_path, show="JobId=5 JobState=CANCELLED Reason=None", show_sleep=5)
    start = time.monotonic()
    assert requeue_job("5", scontrol=str(exe), timeout=0.5) is True
    assert time.monotonic() - start < 4


def test_cancelled_job_is_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    exe = fake_scontrol(tmp_path, show="JobId=5 JobState=CANCELLED Reason=None")
    with caplog.at_level(logging.WARNING, logger="hpcdp.runtime.preempt"):
        assert requeue_job("5", scontrol=str(exe)) is False
    assert caplog.messages == [
        "job 5 not requeued: job is being cancelled (JobState=CANCELLED Reason=None)"]


@pytest.mark.parametrize(
    ("requeue", "message"),
    [
        ("echo boom >&2; echo out; exit 3", "scontrol requeue 5 failed (exit 3): boom"),
        ("echo ' out '; exit 4", "scontrol requeue 5 failed (exit 4): out"),
        ("sleep 5", "scontrol requeue 5 did not answer within 1s"),
    ],
)
def test_failed_requeue_is_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                  requeue: str, message: str) -> None:
    exe = fake_scontrol(tmp_path, show="JobId=5 JobState=RUNNING", requeue=requeue)
    start = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="hpcdp.runtime.preempt"):
        assert requeue_job("5", scontrol=str(exe), timeout=1.0) is False
    assert caplog.messages == [f"job 5 not requeued: {message}"]
    assert time.monotonic() - start < 4.5


def test_a_stalled_job_says_why_it_is_not_requeued(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    exe = fake_scontrol(tmp_path, show="JobId=5 JobState=RUNNING")
    monkeypatch.setattr(watchdog, "_stalled", True)
    with caplog.at_level(logging.WARNING, logger="hpcdp.runtime.preempt"):
        assert requeue_job("5", scontrol=str(exe)) is False
    assert caplog.messages == ["job 5 not requeued: a stall was reported (see 'hpcdp stall:')"]


# ---- requeue decisions and outcomes in full (mutation survivors) -------------------------


def test_a_job_submitted_with_no_requeue_is_not_requeued() -> None:
    from hpcdp.runtime.preempt import requeue_wanted

    assert requeue_wanted("JobId=5 JobState=RUNNING Reason=None Requeue=0") == (
        False, "the job was submitted with --no-requeue (Requeue=0)")
    assert requeue_wanted("JobId=5 JobState=RUNNING Reason=None Requeue=1") == (
        True, "JobState=RUNNING Reason=None")


def test_an_array_task_id_without_its_array_id_requeues_the_job() -> None:
    assert requeue_target({"SLURM_JOB_ID": "7", "SLURM_ARRAY_TASK_ID": "3"}) == "7"
    assert requeue_target({"SLURM_JOB_ID": "7", "SLURM_ARRAY_JOB_ID": "6"}) == "7"


def test_a_first_run_may_requeue_with_a_cap_of_one() -> None:
    from hpcdp.runtime.preempt import stop_outcome

    asked: list[str] = []

    def attempt(job: str) -> tuple[str, str]:
        asked.append(job)
        return "requeued", "ok"

    # SLURM_RESTART_COUNT unset: never requeued yet, so one requeue is still allowed.
    assert stop_outcome("preempted", True, 1, {"SLURM_JOB_ID": "9"}, attempt) == (
        ", requeued job 9", 0)
    assert asked == ["9"]


def test_try_requeue_outcomes_in_full(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from hpcdp.runtime.preempt import try_requeue

    missing = str(tmp_path / "nowhere" / "scontrol")
    assert try_requeue("5", scontrol=missing) == ("failed", f"{missing} not found")
    exe = fake_scontrol(tmp_path, show="JobId=5 JobState=COMPLETING Reason=None")
    assert try_requeue("5", scontrol=str(exe)) == (
        "refused", "job is being cancelled (JobState=COMPLETING Reason=None)")
    exe = fake_scontrol(tmp_path, show="JobId=5 JobState=RUNNING Reason=None",
                        requeue="echo 'Invalid job id' >&2; exit 1")
    assert try_requeue("5", scontrol=str(exe)) == (
        "failed", "scontrol requeue 5 failed (exit 1): Invalid job id")
    exe = fake_scontrol(tmp_path, show="JobId=5 JobState=RUNNING Reason=None")
    assert try_requeue("5", scontrol=str(exe)) == ("requeued", "JobState=RUNNING Reason=None")
    with caplog.at_level(logging.WARNING):
        assert requeue_job("5", scontrol=str(exe)) is True
    assert caplog.records == []  # a requeue that worked logs nothing
