"""Fault specs parse strictly; faults act only at their rank, step and phase."""

from __future__ import annotations

import math

import pytest
import torch

from hpcdp.runtime import faults
from hpcdp.runtime.faults import Fault, FaultError, parse


def test_parse_several() -> None:
    got = parse("raise:rank=1:step=3; stall:step=2:seconds=7.5;nan:step=4:rank=0")
    assert got == [Fault("raise", 3, 1), Fault("stall", 2, None, 7.5), Fault("nan", 4, 0)]
    assert parse("") == []


@pytest.mark.parametrize(
    ("text", "needle"),
    [("explode:step=1", "unknown fault 'explode'"), ("kill:rank=1", "has no step=N"),
     ("kill:step=x", "not a number"), ("kill:step=1:when=2", "bad part 'when=2'"),
     ("nan:step", "bad part 'step'"), ("nan:step=1:phase=data", "phase=data is not allowed"),
     ("stall:step=1:phase=loading", "phase=loading is not allowed"),
     ("stall:step=1:factor=2", "factor=F belongs to slow"),
     ("slow:rank=1:factor=0.5", "must be at least 1"), ("slow:factor=fast", "not a number")],
)
def test_parse_errors_name_the_problem(text: str, needle: str) -> None:
    with pytest.raises(FaultError, match=needle):
        parse(text)


def test_parse_phases_and_stragglers() -> None:
    got = parse("stall:rank=1:step=5:seconds=60:phase=collective;slow:rank=1:factor=1.5;"
                "slow:step=3:factor=2;kill:step=2:phase=checkpoint")
    assert got == [Fault("stall", 5, 1, 60.0, "collective"), Fault("slow", 0, 1, factor=1.5),
                   Fault("slow", 3, None, factor=2.0), Fault("kill", 2, None, phase="checkpoint")]


def test_slow_hits_from_its_step_on() -> None:
    f = Fault("slow", 3, rank=1, factor=2.0)
    assert not f.hits(2, 1) and f.hits(3, 1) and f.hits(40, 1) and not f.hits(40, 0)


def test_hits_only_its_rank_and_step() -> None:
    f = Fault("kill", 3, rank=1)
    assert f.hits(3, 1) and not f.hits(3, 0) and not f.hits(2, 1)
    assert Fault("nan", 3).hits(3, 5)


def test_inject(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(faults, "_armed", parse("raise:rank=1:step=2;nan:step=4"))
    assert faults.inject(2, 0) is False
    with pytest.raises(faults.InjectedFault, match="rank 1 at step 2"):
        faults.inject(2, 1)
    assert faults.inject(4, 0) is True


def test_phased_faults_act_at_their_phase_once_and_not_before_the_step(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(faults, "_armed", parse("raise:rank=1:step=2:phase=forward"))
    assert faults.inject(2, 1) is False  # not at the step's start
    assert faults.phase_hook(0) is None  # nothing for rank 0: marks stay free
    hook = faults.phase_hook(1)
    assert hook is not None
    hook("data", 2)
    hook("forward", 1)
    with pytest.raises(faults.InjectedFault, match="rank 1 at step 2, phase forward"):
        hook("forward", 2)
    hook("forward", 2)  # once only


def test_slow_makes_each_step_about_factor_times_as_long(
        monkeypatch: pytest.MonkeyPatch) -> None:
    class Clock:  # a fake clock: the test does not depend on the machine's load
        now = 0.0
        slept: list[float] = []

        def monotonic(self) -> float:
            return self.now

        def sleep(self, seconds: float) -> None:
            self.slept.append(seconds)
            self.now += seconds

    clock = Clock()
    monkeypatch.setattr(faults, "time", clock)
    monkeypatch.setattr(faults, "_armed", parse("slow:rank=0:factor=3"))
    monkeypatch.setattr(faults, "_slowdown", faults._Slowdown())
    took = []
    for step in range(4):
        t0 = clock.now
        faults.inject(step, 0)
        clock.now += 0.05  # the rank's own work
        took.append(clock.now - t0)
    assert took[0] == pytest.approx(0.05)  # nothing measured yet
    assert took[1:] == pytest.approx([0.15] * 3)  # 3 x the rank's own work
    before = len(clock.slept)
    faults.inject(9, 1)  # another rank: no delay
    assert len(clock.slept) == before


def test_poison_keeps_the_graph() -> None:
    w = torch.ones(2, requires_grad=True)
    loss = faults.poison((w * 2).sum())
    loss.backward()
    assert math.isnan(loss.item()) and torch.isnan(w.grad).all()


def test_uneven_steps_are_refused_before_training() -> None:
    from hpcdp.train.setup import uneven_steps_error

    assert uneven_steps_error([10, 10, 10]) is None
    assert uneven_steps_error([7]) is None
    why = uneven_steps_error([10, 9])
    assert why is not None and "rank 0: 10, rank 1: 9" in why and "hang" in why
