"""Preemption flag and agreement logic, with real signals delivered to this process."""

from __future__ import annotations

import os
import signal

import pytest

from hpcdp.runtime.preempt import (
    Preemption,
    job_fields,
    requeue_job,
    requeue_wanted,
    signal_number,
)


def test_signal_names() -> None:
    assert signal_number("USR1") is signal.SIGUSR1
    assert signal_number("sigterm") is signal.SIGTERM
    with pytest.raises(ValueError, match="NOPE"):
        signal_number("NOPE")


def test_real_signal_sets_flag_and_agreement_uses_max() -> None:
    p = Preemption(["USR1"], check_every=2).install()
    try:
        seen: list[int] = []

        def start_max(v: int):
            seen.append(v)
            return lambda: max(v, 0)  # as if the other ranks had no signal

        assert not p.agreed_lagged(2, start_max)
        os.kill(os.getpid(), signal.SIGUSR1)
        assert p.requested and p.received == signal.SIGUSR1
        assert not p.agreed_lagged(3, start_max)  # not a check step: no collective at all
        assert not p.agreed_lagged(4, start_max)  # sends 1; reads check 2's 0
        assert p.agreed_lagged(6, start_max)
        assert seen == [0, 1, 1]
        p.drain()
        # Another rank's flag alone is enough.
        q = Preemption(["USR1"], check_every=1)
        q.agreed_lagged(1, lambda v: lambda: 1)
        assert q.agreed_lagged(2, lambda v: lambda: 1)
    finally:
        p.uninstall()
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL


def test_lagged_agreement_reads_the_previous_check() -> None:
    p = Preemption(["USR1"], check_every=2)
    sent: list[int] = []
    waited: list[int] = []

    def start_max(v: int):
        sent.append(v)
        index = len(sent) - 1
        return lambda: waited.append(index) or max(v, 0)

    assert not p.agreed_lagged(2, start_max)  # nothing in flight yet: no result to read
    p.received = signal.SIGUSR1  # as a handler would
    assert not p.agreed_lagged(3, start_max)  # not a check step: nothing sent or read
    assert not p.agreed_lagged(4, start_max)  # reads check 2's result (0), sends 1
    assert p.agreed_lagged(6, start_max)  # reads check 4's result (1): stop, on every rank
    assert sent == [0, 1, 1] and waited == [0, 1]
    p.drain()  # the reduction still in flight is waited for, once
    assert waited == [0, 1, 2]
    p.drain()
    assert waited == [0, 1, 2]


def test_check_every_must_be_positive() -> None:
    with pytest.raises(ValueError):
        Preemption(["USR1"], check_every=0)


def test_requeue_without_scontrol_reports_failure() -> None:
    assert requeue_job("123", scontrol="no-such-scontrol-binary") is False


def test_requeue_returns_exit_status(tmp_path) -> None:
    ok = tmp_path / "ok"
    ok.write_text("#!/bin/sh\n[ \"$1\" = requeue ] && [ \"$2\" = 42 ]\n")
    ok.chmod(0o755)
    assert requeue_job("42", scontrol=str(ok)) is True
    assert requeue_job("41", scontrol=str(ok)) is False


@pytest.mark.parametrize(
    ("show", "wanted"),
    [
        # As measured from inside a job on Slurm 22.05 (`scontrol show job -o ID`).
        ("JobId=7 JobName=t UserId=root(0) JobState=COMPLETING Reason=None Dependency=(null)",
         False),  # the user's scancel
        ("JobId=7 JobState=CANCELLED Reason=None", False),
        ("JobId=7 JobState=COMPLETING Reason=TimeLimit Dependency=(null)", True),
        ("JobId=7 JobState=COMPLETING Reason=Preempted", True),
        ("JobId=7 JobName=t JobState=RUNNING Reason=None", True),  # --signal=USR1 warning
        ("", True),  # scontrol unreachable: the signal most likely was the warning
    ],
)
def test_requeue_decision(show: str, wanted: bool) -> None:
    got, why = requeue_wanted(show)
    assert got is wanted, why
    if not wanted:
        assert "cancelled" in why


def test_job_fields_takes_first_value() -> None:
    f = job_fields("JobId=1 JobState=RUNNING Reason=None Comment=a=b JobState=X")
    assert f["JobState"] == "RUNNING" and f["Reason"] == "None" and f["Comment"] == "a=b"


def test_cancelled_job_is_not_requeued(tmp_path) -> None:
    fake = tmp_path / "scontrol"
    log = tmp_path / "calls"
    fake.write_text(f"#!/bin/sh\necho \"$@\" >> {log}\n"
                    "[ \"$1\" = show ] && echo 'JobId=5 JobState=COMPLETING Reason=None'\n"
                    "exit 0\n")
    fake.chmod(0o755)
    assert requeue_job("5", scontrol=str(fake)) is False
    assert log.read_text().splitlines() == ["show job -o 5"]


def test_a_stalled_job_is_never_requeued(tmp_path, monkeypatch) -> None:
    """A stall is not a preemption: once the watchdog fired, scontrol is not even asked."""
    from hpcdp.runtime import watchdog

    fake = tmp_path / "scontrol"
    log = tmp_path / "calls"
    fake.write_text(f"#!/bin/sh\necho \"$@\" >> {log}\nexit 0\n")
    fake.chmod(0o755)
    assert requeue_job("7", scontrol=str(fake)) is True  # the fake would requeue
    log.unlink()
    monkeypatch.setattr(watchdog, "_stalled", True)
    assert requeue_job("7", scontrol=str(fake)) is False
    assert not log.exists()
