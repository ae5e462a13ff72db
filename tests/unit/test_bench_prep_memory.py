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


def test_the_real_corpus_is_shards_of_whole_installed_files(tmp_path: Path) -> None:
    from hpcdp.bench import real_corpus

    paths = real_corpus.make_corpus(str(tmp_path / "c"), 3 << 20, shards=3)
    assert [Path(p).name for p in paths] == [f"part-0000{i}.jsonl" for i in range(3)]
    records = [json.loads(line) for p in paths for line in Path(p).read_bytes().splitlines()]
    assert all(1 << 20 <= Path(p).stat().st_size < (1 << 20) + max(
        len(json.dumps(r, ensure_ascii=False).encode()) for r in records) + 1 for p in paths)
    sizes = sorted(len(r["text"]) for r in records)
    assert sizes[0] < 1000 < 10_000 < sizes[-1]  # documents of varied sizes, none empty
    listed = real_corpus.source_files(real_corpus.source_roots())
    first = next(Path(p) for p in listed if Path(p).read_bytes().strip())
    assert records[0] == {"text": first.read_text(encoding="utf-8"), "source": first.name}
