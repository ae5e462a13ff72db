"""`hpcdp report`: per-rank phase seconds summed from train records (pure), the picture drawn
from that table (its bars read back from the Axes), and the command's errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hpcdp.train import report_command
from hpcdp.train.reporting import RANK_PHASES, StepSplit, StepTimes, rank_fields
from hpcdp.train.time_split import OWN_PHASES, rank_times


def record(step: int, **per_rank: list[float]) -> dict:
    """A train record with per-rank seconds: the phases named, zeros elsewhere."""
    ranks = len(next(iter(per_rank.values())))
    rec = {"kind": "train", "step": step, "loss": 1.0}
    rec.update({f"ranks_{p}_s": per_rank.get(p, [0.0] * ranks) for p in RANK_PHASES})
    return rec


RECORDS = [
    {"kind": "val", "step": 0},
    record(10, data=[1.0, 1.0], compute=[2.0, 6.0], comm=[4.0, 0.5], other=[0.1, 0.2]),
    {"kind": "train", "step": 15, "loss": 1.0},  # written before per-rank times existed
    record(20, data=[1.0, 1.0], compute=[2.0, 6.0], comm=[4.0, 0.5], checkpoint=[0.5, 0.5]),
]


def test_records_sum_to_one_row_per_rank() -> None:
    times = rank_times(RECORDS)
    assert times.ranks == 2 and times.steps == 20 and times.records == 2
    assert times.seconds["compute"] == [4.0, 12.0]
    assert times.seconds["comm"] == [8.0, 1.0]
    assert times.own() == pytest.approx([2 + 4 + 0.1 + 0.5, 2 + 12 + 0.2 + 0.5])
    assert times.slowest() == 1


def test_no_per_rank_times_and_a_changed_world_are_errors() -> None:
    with pytest.raises(ValueError, match="no train record with per-rank times"):
        rank_times([{"kind": "train", "step": 5}])
    with pytest.raises(ValueError, match="of 3 ranks, earlier ones of 2"):
        rank_times([record(5, data=[1.0, 1.0]), record(10, data=[1.0, 1.0, 1.0])])


def test_the_bars_are_the_table() -> None:
    times = rank_times(RECORDS)
    (ax,) = report_command.draw(times, "test").axes
    own, waits = report_command.bars(ax)
    assert own == pytest.approx(times.own())
    assert waits == times.seconds["comm"]
    assert len(ax.containers) == len(OWN_PHASES) + 1
    assert [t.get_text() for t in ax.get_xticklabels()] == ["rank 0", "rank 1"]


def test_a_window_gives_the_record_its_per_rank_lists() -> None:
    window = StepTimes()
    window.add(StepSplit(0.1, 0.2, 0.3, 0.05), 16)
    window.exclude(0.4, checkpoint=True)
    window.exclude(9.0)  # validation: neither in the wall time nor a checkpoint
    mine = window.phase_seconds()
    assert mine[:5] == [0.1, 0.2, 0.3, 0.05, 0.4] and mine[5] >= 0.0
    fields = rank_fields([mine, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]])
    assert fields["ranks_compute_s"] == [0.2, 2.0] and fields["ranks_other_s"][1] == 6.0
    assert rank_times([{"kind": "train", "step": 1, **fields}]).slowest() == 1


def test_the_command_writes_the_png_and_prints_the_table(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    done = subprocess.run([sys.executable, "-m", "hpcdp", "report", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "most own time: rank 1" in done.stdout
    png = (tmp_path / "time.png").read_bytes()
    assert png.startswith(b"\x89PNG")


def test_the_command_names_what_is_missing(tmp_path: Path) -> None:
    assert report_command.main([str(tmp_path)]) == 2
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"kind": "train", "step": 1}) + "\n")
    assert report_command.main([str(tmp_path / "metrics.jsonl")]) == 2
