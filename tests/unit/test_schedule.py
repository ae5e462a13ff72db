"""The learning rate as a function of the step: scaling, warmup, cosine and step decay."""

from __future__ import annotations

import math

import pytest

from hpcdp import schedule as s


def test_lr_scale_rules() -> None:
    assert s.lr_scale(4, 2, adasum=False) == 8.0
    assert s.lr_scale(4, 2, adasum=True) == 2.0
    assert s.lr_scale(4, 2, adasum=False, enabled=False) == 1.0


def test_warmup_is_linear_to_the_scaled_peak() -> None:
    sch = s.from_epochs(0.1, 4.0, "constant", steps_per_epoch=10, epochs=5, warmup_epochs=2)
    assert sch.warmup_steps == 20
    assert sch.lr(0) == 0.0
    assert sch.lr(10) == pytest.approx(0.2)
    assert sch.lr(20) == pytest.approx(0.4)
    assert sch.lr(49) == pytest.approx(0.4)
    rates = [sch.lr(i) for i in range(21)]
    assert rates == sorted(rates)


def test_warmup_start_factor() -> None:
    sch = s.Schedule(base_lr=1.0, warmup_steps=10, warmup_start_factor=0.1, kind="constant")
    assert sch.lr(0) == pytest.approx(0.1)
    assert sch.lr(5) == pytest.approx(0.55)


def test_cosine_reaches_min_at_the_end() -> None:
    sch = s.from_epochs(1.0, 1.0, "cosine", steps_per_epoch=10, epochs=10, warmup_epochs=1,
                        min_factor=0.1)
    assert sch.lr(10) == pytest.approx(1.0)
    mid = 10 + (100 - 10) / 2
    assert sch.lr(int(mid)) == pytest.approx(0.1 + 0.9 * 0.5)
    assert sch.lr(100) == pytest.approx(0.1)
    assert sch.lr(1000) == pytest.approx(0.1)
    after = [sch.lr(i) for i in range(10, 101)]
    assert all(a >= b for a, b in zip(after, after[1:], strict=False))


def test_step_decay_at_milestones() -> None:
    sch = s.from_epochs(1.0, 2.0, "step", steps_per_epoch=10, epochs=9, milestones=[3, 6],
                        gamma=0.1)
    assert sch.milestones == (30, 60)
    assert sch.lr(29) == pytest.approx(2.0)
    assert sch.lr(30) == pytest.approx(0.2)
    assert sch.lr(60) == pytest.approx(0.02)


def test_errors() -> None:
    with pytest.raises(ValueError):
        s.lr_at(-1, s.Schedule(base_lr=1.0))
    with pytest.raises(ValueError):
        s.from_epochs(1.0, 1.0, "cosine", steps_per_epoch=0, epochs=1)
    with pytest.raises(ValueError):
        s.Schedule(base_lr=1.0, kind="nope").lr(0)


def test_is_a_pure_function() -> None:
    sch = s.from_epochs(0.1, 2.0, "cosine", 7, 3, warmup_epochs=0.5)
    assert [sch.lr(i) for i in range(21)] == [sch.lr(i) for i in range(21)]
    assert not any(math.isnan(sch.lr(i)) for i in range(21))
