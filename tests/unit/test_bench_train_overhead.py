"""The pure parts of the in-process overhead step of `hpcdp bench train`."""

from __future__ import annotations

import pytest

from hpcdp.bench import train_overhead
from hpcdp.bench.train import checks


def test_blocks_last_about_half_a_second_within_bounds() -> None:
    assert train_overhead.steps_per_block(25.0) == 20
    assert train_overhead.steps_per_block(170.0) == 3  # at least 3 steps
    assert train_overhead.steps_per_block(1.0) == 200  # at most 200
    with pytest.raises(ValueError, match="positive"):
        train_overhead.steps_per_block(0.0)


def test_the_command_carries_the_models_overrides() -> None:
    cmd = train_overhead.command(["model.name=resnet18", "image.width=32"], 8, 20, "resnet18")
    i = cmd.index("hpcdp.bench.step_overhead")
    assert cmd[i + 1:] == ["--blocks", "8", "--steps", "20", "--warmup", "20", "--label",
                           "resnet18", "model.name=resnet18", "image.width=32"]


def _summary(share: float | None, vs_bare_1: float) -> dict:
    s = {"efficiency": 0.9, "shares": {"data": 0.01}, "vs_ddp": None, "vs_bare_1": vs_bare_1}
    if share is not None:
        s["in_process"] = {"overhead_share": share}
    return {"resnet18": s}


def test_the_in_process_figure_decides_the_overhead_check_where_it_ran() -> None:
    key = "resnet18 1 rank within 2% of the bare loop (one process)"
    assert checks(_summary(0.015, 0.90))[key] is True  # separate launches' noise ignored
    assert checks(_summary(0.025, 1.00))[key] is False
    plain = checks(_summary(None, 0.97))
    assert plain["resnet18 1 rank within 2% of the bare loop"] is False and key not in plain


def test_make_bench_rows_hold_each_model_to_its_own_overhead_target() -> None:
    from hpcdp.bench import overhead_rows

    assert overhead_rows("resnet18", {"overhead_share": 0.019, "overhead_ms": 0.5}) == [
        ("resnet18: 1-rank step within 2% of the bare loop's (one process)", "+1.9%", True)]
    assert overhead_rows("digits_cnn", {"overhead_share": 0.12, "overhead_ms": 0.241}) == [
        ("digits_cnn: 1-rank step at most 0.46 ms over the bare loop's (one process)",
         "+0.241 ms", True)]
    assert overhead_rows("digits_cnn", {"overhead_share": 0.3, "overhead_ms": 0.5})[0][2] is False
    assert overhead_rows("gpt", {"overhead_share": 0.0, "overhead_ms": 0.0}) == []
