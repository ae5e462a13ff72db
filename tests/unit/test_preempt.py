"""Preemption flag and agreement logic, with real signals delivered to this process."""

from __future__ import annotations

import os
import signal

import pytest

from hpcdp.preempt import Preemption, requeue_job, signal_number


def test_signal_names() -> None:
    assert signal_number("USR1") is signal.SIGUSR1
    assert signal_number("sigterm") is signal.SIGTERM
    with pytest.raises(ValueError, match="NOPE"):
        signal_number("NOPE")


def test_real_signal_sets_flag_and_agreement_uses_max() -> None:
    p = Preemption(["USR1"], check_every=2).install()
    try:
        seen: list[int] = []

        def reduce_max(v: int) -> int:
            seen.append(v)
            return max(v, 0)  # as if the other ranks had no signal

        assert not p.agreed(2, reduce_max)
        os.kill(os.getpid(), signal.SIGUSR1)
        assert p.requested and p.received == signal.SIGUSR1
        assert not p.agreed(3, reduce_max)  # not a check step: no collective at all
        assert p.agreed(4, reduce_max)
        assert seen == [0, 1]
        # Another rank's flag alone is enough.
        q = Preemption(["USR1"], check_every=1)
        assert q.agreed(1, lambda v: 1)
    finally:
        p.uninstall()
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL


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
