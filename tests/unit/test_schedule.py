"""The learning rate as a function of the step: scaling, warmup, cosine, polynomial, steps."""

from __future__ import annotations

import math

import pytest

from hpcdp.train import schedule as s


def test_lr_scale_rules() -> None:
    assert s.lr_scale("linear", 256, 32) == 8.0
    assert s.lr_scale("sqrt", 128, 32) == 2.0
    assert s.lr_scale("none", 256, 32) == 1.0
    assert s.lr_scale("linear", 16, 32) == 0.5
    with pytest.raises(ValueError, match="unknown learning-rate rule"):
        s.lr_scale("cubic", 64, 32)
    with pytest.raises(ValueError):
        s.lr_scale("linear", 0, 32)


@pytest.mark.parametrize("rule", s.LR_RULES)
@pytest.mark.parametrize("global_batch", [64, 96, 192])
def test_same_global_batch_same_peak_on_any_world_size(rule: str, global_batch: int) -> None:
    """The peak rate depends on the global batch alone, not on how it is split."""
    peaks = set()
    for ranks in (1, 2, 4, 8):
        for accum in (1, 2):
            if global_batch % (ranks * accum):
                continue
            per_rank = global_batch // (ranks * accum)
            batch = s.update_batch(per_rank, ranks, accum, adasum=False)
            assert batch == global_batch
            peaks.add(round(0.05 * s.lr_scale(rule, batch, 32), 12))
    assert len(peaks) == 1
    expected = {"linear": 0.05 * global_batch / 32, "sqrt": 0.05 * math.sqrt(global_batch / 32),
                "none": 0.05}[rule]
    assert peaks == {round(expected, 12)}


def test_adasum_follows_one_ranks_update_batch() -> None:
    assert s.update_batch(32, 8, 2, adasum=True) == 64
    assert s.update_batch(32, 8, 2, adasum=False) == 512


def _sched(batch: int, rule: str = "linear", lr: float = 0.05, ref: int = 32) -> s.Schedule:
    return s.from_epochs(lr, s.lr_scale(rule, batch, ref), "cosine", 10, 2, rule=rule,
                         batch=batch, ref_batch=ref)


def test_lr_change_on_resume_names_both() -> None:
    import dataclasses

    saved = dataclasses.asdict(_sched(64))
    assert s.lr_change_on_resume(saved, _sched(64)) is None
    msg = s.lr_change_on_resume(saved, _sched(128))
    assert msg is not None and "update batch 64 -> 128" in msg and "peak lr 0.1 -> 0.2" in msg
    assert "optim.allow_lr_change" in msg
    msg = s.lr_change_on_resume(saved, _sched(64, rule="sqrt"))
    assert msg is not None and "rule linear -> sqrt" in msg
    # The same peak from another lr and batch is still another run's dynamics.
    msg = s.lr_change_on_resume(saved, _sched(128, lr=0.025))
    assert msg is not None and "update batch 64 -> 128" in msg and "peak lr" not in msg
    # An older checkpoint records only its rate: compared by the peak alone.
    legacy = {"base_lr": 0.05, "scale": 2.0}
    assert s.lr_change_on_resume(legacy, _sched(64)) is None
    assert "peak lr 0.1 -> 0.2" in s.lr_change_on_resume(legacy, _sched(128))


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


@pytest.mark.parametrize("power", [1.0, 2.0, 0.5])
def test_polynomial_decays_from_the_peak_after_warmup(power: float) -> None:
    sch = s.from_epochs(2.0, 1.0, "polynomial", steps_per_epoch=10, epochs=10,
                        warmup_epochs=1, min_factor=0.1, power=power)
    assert sch.lr(5) == pytest.approx(1.0)  # warmup from 0 to the peak 2.0
    assert sch.lr(10) == pytest.approx(2.0)
    # a quarter of the decay done: 2 x (0.1 + 0.9 x 0.75^power)
    assert sch.lr(10 + 90 // 4 + 1) == pytest.approx(2.0 * (0.1 + 0.9 * (1 - 23 / 90) ** power))
    assert sch.lr(100) == pytest.approx(0.2) and sch.lr(500) == pytest.approx(0.2)


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
    """Each rate follows from the step alone: called in any order, it is the closed form."""
    sch = s.from_epochs(0.1, 2.0, "cosine", 7, 3, warmup_epochs=0.5)
    # Half an epoch of 7 steps is 3.5 steps, rounded to 4 (not truncated to 3).
    assert (sch.warmup_steps, sch.total_steps) == (4, 21)
    expected = [0.2 * i / 4 for i in range(4)] + [
        0.2 * 0.5 * (1 + math.cos(math.pi * (i - 4) / 17)) for i in range(4, 22)]
    forward = [sch.lr(i) for i in range(22)]
    backward = [sch.lr(i) for i in reversed(range(22))][::-1]
    assert forward == pytest.approx(expected, abs=1e-12)
    assert backward == forward


@pytest.mark.parametrize(("epochs", "per_epoch", "steps"),
                         [(0.5, 7, 4), (0.75, 10, 8), (1.25, 4, 5), (0.3, 10, 3)])
def test_fractional_warmup_epochs_round_to_the_nearest_step(epochs: float, per_epoch: int,
                                                             steps: int) -> None:
    sch = s.from_epochs(1.0, 1.0, "constant", per_epoch, 4, warmup_epochs=epochs)
    assert sch.warmup_steps == steps
    assert sch.lr(steps - 1) < 1.0 == sch.lr(steps)
