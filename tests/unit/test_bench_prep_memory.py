"""The memory benchmark's pure parts: a rank's record, and the ratio of the largest ranks."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from hpcdp.bench import prep_memory


def test_a_measured_script_leaves_its_peak_and_status(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.delenv("OMPI_COMM_WORLD_RANK", raising=False)
    script = tmp_path / "s.py"
    script.write_text("import sys\nassert sys.argv[1:] == ['a']\nsys.exit(3)\n")
    assert prep_memory.measured(str(tmp_path), str(script), ["a"]) == 3
    record = json.loads((tmp_path / "rss-0.json").read_text())
    assert record["status"] == 3 and record["peak_kib"] > 1000
    assert prep_memory.peaks(tmp_path) == [record["peak_kib"]]


def test_the_ratio_is_of_the_largest_rank_at_each_size() -> None:
    rows = [{"case": "text", "input": 500, "peak_kib": [1200, 1300]},
            {"case": "text", "input": 100, "peak_kib": [1000, 900]},
            {"case": "images", "input": 2000, "peak_kib": [1000, 1000]},
            {"case": "images", "input": 8000, "peak_kib": [1000, 2000]}]
    got = prep_memory.summarize(rows)
    assert got["text"]["ratio"] == 1.3 and not got["text"]["ok"]
    assert got["images"]["ratio"] == 2.0 and list(got) == ["text", "images"]
    rows[0]["peak_kib"] = [1250, 1100]
    assert prep_memory.summarize(rows)["text"]["ok"]
