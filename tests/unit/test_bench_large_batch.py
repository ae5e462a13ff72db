"""`hpcdp bench large-batch`: its runs, their arguments, and the tables built from results
(pure: no run is started here)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from hpcdp.bench import large_batch as lb

DIGITS = lb.WORKLOADS["digits"]


def test_cases_of_a_workload() -> None:
    found = lb.cases(DIGITS, [1, 8, 32], lb.DEFAULT_COMPRESSIONS)
    assert [c.label for c in found] == [
        "digits-x1-sgd-linear", "digits-x1-lars-linear",
        "digits-x8-sgd-linear", "digits-x8-sgd-sqrt", "digits-x8-lars-linear",
        "digits-x32-sgd-linear", "digits-x32-sgd-sqrt", "digits-x32-lars-linear",
        "digits-x1-sgd-linear-bf16", "digits-x1-sgd-linear-powersgd1",
        "digits-x1-sgd-linear-powersgd4", "digits-x1-sgd-linear-powersgd16"]
    assert found[-1].compression_label == "powersgd rank 16"


def test_case_arguments(tmp_path: Path) -> None:
    case = lb.Case("digits", 8, "sgd", "sqrt", "powersgd", 4)
    argv = lb.case_args(DIGITS, case, tmp_path / "data", tmp_path / "run")
    assert "data.global_batch_size=64" in argv and "optim.lr_scaling=sqrt" in argv
    assert "optim.ref_batch=8" in argv and f"optim.lr={DIGITS.lr}" in argv
    assert "horovod.compression=powersgd" in argv and "horovod.powersgd_rank=4" in argv
    lars = lb.case_args(DIGITS, lb.Case("digits", 1, "lars", "linear"), tmp_path, tmp_path)
    assert f"optim.lr={DIGITS.large_lr}" in lars and "horovod.compression=none" in lars
    assert not any(a.startswith("horovod.powersgd_rank") for a in lars)


@pytest.mark.parametrize("text,message", [("powersgd", "powersgd:RANK"),
                                          ("powersgd:0", "RANK >= 1"), ("zip", "choose none")])
def test_bad_compressions(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        lb.parse_compression(text)


def summary(metric: float, sent: int = 1000, steps: int = 10) -> dict[str, Any]:
    return {"val_acc": metric, "steps": steps, "samples_seen": steps * 8, "peak_lr": 0.02,
            "gradient_traffic": {"bytes_per_step": sent, "uncompressed_bytes_per_step": 1000}}


def results() -> list[dict[str, Any]]:
    made = [(lb.Case("digits", 1, "sgd", "linear"), summary(0.98)),
            (lb.Case("digits", 1, "lars", "linear"), summary(0.97)),
            (lb.Case("digits", 8, "sgd", "linear"), None),
            (lb.Case("digits", 8, "sgd", "sqrt"), summary(0.95)),
            (lb.Case("digits", 8, "lars", "linear"), summary(0.975)),
            (lb.Case("digits", 1, "sgd", "linear", "powersgd", 4), summary(0.96, sent=50))]
    found = [lb.result_of(DIGITS, case, s, 5.0) for case, s in made]
    return found + [lb.result_of(DIGITS, lb.Case("digits", 1, "sgd", "linear", "bf16"), None,
                                 3.0, failure="exit 1: ConfigError")]


def test_the_batch_table() -> None:
    rows = lb.batch_rows(results())
    assert [r[1] for r in rows] == ["8 (1x)", "8 (1x)", "64 (8x)", "64 (8x)", "64 (8x)"]
    assert rows[0][-1] == "(reference)" and rows[0][3] == "-"
    assert rows[1][-1] == "-0.0100"  # LARS at the reference batch, against SGD's
    assert rows[2][-2:] == ["diverged", "-"]
    assert len(rows) == 5  # the failed bf16 run is in the compression table only
    assert rows[3][-2:] == ["0.9500", "-0.0300"] and rows[4][-1] == "-0.0050"


def test_the_compression_table() -> None:
    rows = lb.compression_rows(results())
    assert rows == [["digits", "none", "0.001", "1/1", "0.9800", "(reference)"],
                    ["digits", "powersgd rank 4", "5e-05", "1/20", "0.9600", "-0.0200"],
                    ["digits", "bf16", "-", "-", "failed", "-"]]


def test_the_headline() -> None:
    (line,) = lb.headline(results(), [DIGITS])
    assert line == ("digits (val acc, reference 0.9800 with sgd at batch 8): at 8x, "
                    "sgd linear diverged, sgd sqrt 0.9500 (-0.0300), "
                    "lars linear 0.9750 (-0.0050)")
    assert lb.headline(results(), [DIGITS], mult=32) == []


def test_workload_options() -> None:
    args = argparse.Namespace(workloads="digits", large=["digits=sgd:0.05"], epochs=2)
    (w,) = lb.chosen_workloads(args)
    assert (w.large, w.large_lr, w.epochs) == ("sgd", 0.05, 2)
    with pytest.raises(ValueError, match="choose from"):
        lb.chosen_workloads(argparse.Namespace(workloads="mnist", large=[], epochs=None))
    with pytest.raises(SystemExit):
        lb.parse_args(["--compressions", "powersgd:x"])
