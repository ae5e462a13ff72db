"""The schedule at its edges: defaults, boundaries and the exact messages.

Each test pins down a behaviour that mutation testing (`make mutate`) found
unguarded: a default, an off-by-one, or a message a user reads.
"""

from __future__ import annotations

import pytest
import torch

from hpcdp.train import schedule as s


def test_from_epochs_defaults_and_pass_through() -> None:
    assert s.from_epochs(0.5, 2.0, "cosine", 1, 3) == s.Schedule(
        base_lr=0.5, scale=2.0, kind="cosine", warmup_steps=0, warmup_start_factor=0.0,
        total_steps=3, min_factor=0.0, milestones=(), gamma=0.1, rule="none", batch=0,
        ref_batch=0)
    got = s.from_epochs(0.5, 2.0, "step", 10, 3, warmup_epochs=0.5, warmup_start_factor=0.2,
                        min_factor=0.3, milestones=[1, 2.5], gamma=0.5, rule="sqrt",
                        batch=128, ref_batch=32)
    assert got == s.Schedule(
        base_lr=0.5, scale=2.0, kind="step", warmup_steps=5, warmup_start_factor=0.2,
        total_steps=30, min_factor=0.3, milestones=(10, 25), gamma=0.5, rule="sqrt",
        batch=128, ref_batch=32)


def test_one_step_per_epoch_is_enough() -> None:
    assert s.from_epochs(1.0, 1.0, "constant", 1, 2).total_steps == 2
    with pytest.raises(ValueError, match="steps_per_epoch must be at least 1, got 0"):
        s.from_epochs(1.0, 1.0, "constant", 0, 2)


def test_cosine_right_after_a_warmup_as_long_as_the_run() -> None:
    """No steps left for the decay: the rate drops to the floor at once, no division by 0."""
    sch = s.Schedule(base_lr=1.0, kind="cosine", warmup_steps=10, total_steps=10,
                     min_factor=0.25)
    assert sch.lr(10) == 1.0
    assert sch.lr(11) == pytest.approx(0.25)


def test_errors_name_the_value() -> None:
    with pytest.raises(ValueError, match="step must not be negative, got -3"):
        s.lr_at(-3, s.Schedule(base_lr=1.0))
    with pytest.raises(ValueError, match="unknown schedule kind 'linear'"):
        s.Schedule(base_lr=1.0, kind="linear").lr(0)
    with pytest.raises(ValueError, match=r"batch sizes must be positive, got 0 and 32"):
        s.lr_scale("linear", 0, 32)
    with pytest.raises(ValueError, match=r"got 8 and 0"):
        s.lr_scale("linear", 8, 0)
    with pytest.raises(ValueError) as err:
        s.lr_scale("cubic", 8, 8)
    assert str(err.value) == ("unknown learning-rate rule 'cubic'; choose one of linear, sqrt, "
                              "none")


def test_a_batch_of_one_is_a_batch() -> None:
    assert s.lr_scale("linear", 1, 1) == 1.0
    assert s.lr_scale("linear", 1, 4) == 0.25
    assert s.lr_scale("sqrt", 4, 1) == 2.0


def test_lr_change_message_in_full() -> None:
    now = s.from_epochs(0.1, 2.0, "cosine", 10, 1, rule="linear", batch=64, ref_batch=32)
    saved = {"base_lr": 0.1, "scale": 1.0, "rule": "none", "batch": 32, "ref_batch": 64}
    assert s.lr_change_on_resume(saved, now) == (
        "the checkpoint was trained with another learning rate than this run would use "
        "(update batch 32 -> 64, rule none -> linear, ref batch 64 -> 32, peak lr 0.1 -> 0.2); "
        "keep data.global_batch_size and the optim settings of the checkpoint's config, or set "
        "optim.allow_lr_change=true to resume anyway")


def test_lr_change_compares_the_ref_batch_alone() -> None:
    now = s.from_epochs(0.1, 1.0, "cosine", 10, 1, rule="none", batch=32, ref_batch=32)
    msg = s.lr_change_on_resume({"base_lr": 0.1, "scale": 1.0, "rule": "none", "batch": 32,
                                 "ref_batch": 16}, now)
    assert msg is not None and "ref batch 16 -> 32" in msg and "peak lr" not in msg


def test_lr_change_missing_rate_fields_default_to_no_rate_and_no_scaling() -> None:
    """A saved schedule without base_lr had no rate (0); one without scale was unscaled (1)."""
    two = s.Schedule(base_lr=2.0)
    assert "peak lr 0 -> 2" in (s.lr_change_on_resume({"scale": 2.0}, two) or "")
    assert s.lr_change_on_resume({"base_lr": 2.0}, two) is None
    assert "peak lr 1 -> 2" in (s.lr_change_on_resume({"base_lr": 1.0}, two) or "")


def test_lr_change_tolerates_rounding_only() -> None:
    now = s.Schedule(base_lr=0.1, scale=3.0)
    assert s.lr_change_on_resume({"base_lr": 0.3, "scale": 1.0}, now) is None  # 0.1*3 != 0.3
    assert s.lr_change_on_resume({"base_lr": 0.3 * (1 + 1e-6), "scale": 1.0}, now) is not None


def test_set_lr_writes_every_parameter_group() -> None:
    a, b = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(3))
    opt = torch.optim.SGD([{"params": [a], "lr": 0.5}, {"params": [b], "lr": 0.7}], lr=0.1)
    s.set_lr(opt, 0.25)
    assert [g["lr"] for g in opt.param_groups] == [0.25, 0.25]
