"""Fault specs parse strictly; faults act only at their rank and step; the watchdog fires."""

from __future__ import annotations

import math
import threading
import time

import pytest
import torch

from hpcdp import faults
from hpcdp.faults import Fault, FaultError, parse


def test_parse_several() -> None:
    got = parse("raise:rank=1:step=3; stall:step=2:seconds=7.5;nan:step=4:rank=0")
    assert got == [Fault("raise", 3, 1), Fault("stall", 2, None, 7.5), Fault("nan", 4, 0)]
    assert parse("") == []


@pytest.mark.parametrize(
    ("text", "needle"),
    [("explode:step=1", "unknown fault 'explode'"), ("kill:rank=1", "has no step=N"),
     ("kill:step=x", "not a number"), ("kill:step=1:when=2", "bad part 'when=2'"),
     ("nan:step", "bad part 'step'")],
)
def test_parse_errors_name_the_problem(text: str, needle: str) -> None:
    with pytest.raises(FaultError, match=needle):
        parse(text)


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


def test_poison_keeps_the_graph() -> None:
    w = torch.ones(2, requires_grad=True)
    loss = faults.poison((w * 2).sum())
    loss.backward()
    assert math.isnan(loss.item()) and torch.isnan(w.grad).all()


def test_watchdog_fires_without_beats_and_not_with_them() -> None:
    fired = threading.Event()
    dog = faults.Watchdog(0.4, rank=3, on_timeout=fired.set).start()
    for step in range(6):  # beating keeps it quiet
        dog.beat(step)
        time.sleep(0.1)
    assert not fired.is_set()
    assert fired.wait(3.0)  # no beats: it fires
    dog.stop()


def test_uneven_steps_are_refused_before_training() -> None:
    from hpcdp.train.setup import uneven_steps_error

    assert uneven_steps_error([10, 10, 10]) is None
    assert uneven_steps_error([7]) is None
    why = uneven_steps_error([10, 9])
    assert why is not None and "rank 0: 10, rank 1: 9" in why and "hang" in why
