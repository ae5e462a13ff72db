"""Rank-0 sinks: JSONL records, TensorBoard files, inactive ranks, resume trimming."""

from __future__ import annotations

import json
import time
from pathlib import Path

from hpcdp.train.reporting import (
    Reporter,
    StepSplit,
    StepTimes,
    drop_records_after,
    read_jsonl,
)


def test_active_reporter_writes_jsonl_and_tensorboard(tmp_path: Path) -> None:
    rep = Reporter(tmp_path, True, jsonl=True, tensorboard=True, progress=True, total_steps=4,
                   initial_step=0)
    rep.record("train", 2, {"loss": 1.5, "acc": 0.5, "epoch": 0})
    rep.close()
    (rec,) = read_jsonl(tmp_path / "metrics.jsonl")
    assert rec["kind"] == "train" and rec["step"] == 2 and rec["loss"] == 1.5
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))


def test_inactive_reporter_writes_nothing(tmp_path: Path) -> None:
    rep = Reporter(tmp_path / "r", False, jsonl=True, tensorboard=True, progress=True,
                   total_steps=4, initial_step=0)
    rep.record("train", 1, {"loss": 1.0})
    rep.info("hello")
    rep.close()
    assert not (tmp_path / "r").exists()


def test_resume_drops_records_after_the_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"kind": "train", "step": s}) + "\n" for s in (5, 10, 15)))
    drop_records_after(path, 10)
    assert [r["step"] for r in read_jsonl(path)] == [5, 10]


def test_step_times_summary_and_exclusion() -> None:
    t = StepTimes()
    t.add(StepSplit(0.001, 0.0015, 0.003, 0.0005), 16)
    t.add(StepSplit(0.001, 0.0015, 0.003, 0.0005), 16)
    time.sleep(0.02)
    s = t.summary()
    assert s["data_ms"] == 1.0 and s["compute_ms"] == 2.0 and s["comm_ms"] == 3.0
    assert s["optimizer_ms"] == 0.5  # of compute_ms, as the log line counts it
    assert 0 < s["samples_per_s"] < 32 / 0.02 * 1.01
    t.exclude(10.0)  # time spent validating does not count against throughput
    assert t.summary()["samples_per_s"] > 32 / 0.02
