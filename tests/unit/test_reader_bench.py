"""The pure parts of `hpcdp bench reader` and `hpcdp bench prep`: verdicts and paths."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcdp.bench import prep as bprep
from hpcdp.bench import reader as breader

MIB = 2**20


def _round(raw: float, reader: float, base: float, growth: int = 0,
           anon_growth: int = 0) -> dict[str, float]:
    return {"raw": raw, "reader": reader, "baseline": base, "window_bytes": 24 * MIB,
            "prefetch_bytes": 3 * MIB, "rss_before": 100 * MIB,
            "rss_first_half": 120 * MIB, "rss_peak": 120 * MIB + growth,
            "anon_before": 80 * MIB, "anon_first_half": 85 * MIB,
            "anon_peak": 85 * MIB + anon_growth, "mapped": True}


def test_reader_verdicts_use_within_round_ratios() -> None:
    rounds = [_round(100.0, 60.0, 1.0), _round(200.0, 90.0, 2.0), _round(100.0, 55.0, 1.0)]
    s = breader.summarize(rounds, dataset_bytes=146 * MIB)
    assert s["reader_vs_raw"] == pytest.approx(0.55)
    assert s["reader_vs_baseline"] == pytest.approx(55.0)
    assert all(s["checks"].values())
    grown = breader.summarize([_round(100.0, 60.0, 1.0, growth=64 * MIB)], 146 * MIB)
    assert not grown["checks"][
        "rss does not grow with the file (growth after the first half <= 1 window)"]
    assert not grown["checks"]["rss held <= 2 windows + prefetch + 32 MiB"]
    # Mapped file pages may move by up to a window; the process's own memory may not.
    mapped = breader.summarize([_round(100.0, 60.0, 1.0, growth=20 * MIB)], 146 * MIB)
    assert all(mapped["checks"].values())
    leak = breader.summarize([_round(100.0, 60.0, 1.0, anon_growth=9 * MIB)], 146 * MIB)
    assert not leak["checks"]["anonymous memory flat after the first half (growth <= 8 MiB)"]
    small = breader.summarize([_round(100.0, 40.0, 1.0)], 50 * MIB)
    assert not small["checks"]["reader >= 50% of raw"]
    assert not small["checks"]["dataset >= 4x window"]


def test_prep_verdict_and_result_paths() -> None:
    rounds = [{"ranks": 1, "seconds": 2.0, "wall_seconds": 3.0},
              {"ranks": 2, "seconds": 1.2, "wall_seconds": 2.5},
              {"ranks": 1, "seconds": 2.2, "wall_seconds": 3.1},
              {"ranks": 2, "seconds": 2.6, "wall_seconds": 3.5}]
    s = bprep.summarize(rounds)
    assert s["speedup_2_over_1"] == pytest.approx(2.1 / 1.9)
    assert s["checks"]["2 ranks not slower than 1"]
    assert breader.result_path("bench/results", "reader") == Path("bench/results/reader.json")
    assert breader.result_path("x/r.json", "reader") == Path("x/r.json")


def test_the_reader_benchmark_leaves_this_process_environment_alone(tmp_path, monkeypatch) -> None:
    """Its data is prepared in a child process: preparation sets hpcdp's runtime settings
    (OMP_NUM_THREADS for one rank), which leaked into every benchmark `hpcdp bench all`
    ran after it (2-rank training then ran 2 threads per rank pinned to one core)."""
    import os

    from hpcdp.bench import reader

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    before = dict(os.environ)
    code = reader.main(["--samples", "2048", "--rounds", "1", "--baseline-samples", "64",
                        "--out", str(tmp_path)])
    assert code in (0, 1)  # the verdicts are not this test's business
    assert dict(os.environ) == before
