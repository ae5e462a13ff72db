"""hpcdp bench user-task's pure parts: the medians and ratio, the table, its arguments."""

from __future__ import annotations

import pytest

from hpcdp.bench import module_of, user_task


def runs(built_in: list[float], user: list[float]) -> list[dict]:
    return ([{"side": "built-in", "step_ms": ms} for ms in built_in]
            + [{"side": "user task", "step_ms": ms} for ms in user])


def test_compare_takes_each_sides_median_and_their_ratio() -> None:
    summary = user_task.compare(runs([10.0, 50.0, 11.0], [10.5, 10.0, 99.0]))
    assert summary["step_ms"] == {"built-in": 11.0, "user task": 10.5}
    assert summary["ratio"] == pytest.approx(10.5 / 11.0)
    assert summary["within_target"] and summary["rounds"] == 3


def test_a_user_task_over_two_percent_slower_misses_the_target() -> None:
    assert user_task.compare(runs([10.0], [10.19]))["within_target"]
    assert not user_task.compare(runs([10.0], [10.21]))["within_target"]


def test_compare_refuses_a_missing_side() -> None:
    with pytest.raises(ValueError, match="no user task run"):
        user_task.compare(runs([10.0], []))


def test_table_shows_both_medians_and_the_ratio() -> None:
    text = user_task.table(user_task.compare(runs([4.0], [4.1])))
    lines = text.splitlines()
    assert lines[0].split() == ["task.name", "median", "step", "ms"]
    assert lines[2].split() == ["built-in", "4.000"]
    assert lines[3].split() == ["user", "task", "4.100"]
    assert lines[4].split() == ["user", "task", "/", "built-in", "1.025"]


def test_the_two_sides_differ_only_in_the_task_reference(tmp_path) -> None:
    args = user_task.parse_args([])
    mine = tmp_path / "mytask.py"
    built, user = (user_task.setup_for(side, mine, args) for side in user_task.SIDES)
    assert built.overrides == ("task.name=image",)
    assert user.overrides == (f"task.name={mine}:TASK",)
    assert (built.model, built.config, built.batch) == (user.model, user.config, user.batch)


def test_the_window_must_divide_warmup_and_steps() -> None:
    with pytest.raises(SystemExit):
        user_task.parse_args(["--steps", "30", "--window", "20"])


def test_the_dashed_command_names_its_module() -> None:
    assert module_of("user-task") == "hpcdp.bench.user_task"
    assert module_of("train") == "hpcdp.bench.train"


def test_bench_all_lists_the_check_in_its_table_of_targets() -> None:
    from hpcdp.bench import BENCHMARKS, targets

    assert "user-task" in BENCHMARKS
    for user, met in ((10.5, False), (10.1, True)):
        summary = user_task.compare(runs([10.0], [user]))
        assert targets("user-task", {"summary": summary}) == [
            ("user task's step / the built-in's <= 1.02", f"{user / 10:.3f}", met)]
