"""`hpcdp bench prep --criteo`: the verdict from each rule's largest peak at 1x and 8x."""

from __future__ import annotations

from hpcdp.bench import prep_criteo


def test_the_ratio_of_the_largest_rank_peaks_per_rule() -> None:
    runs = [{"rows": 10, "rule": "buckets", "peak_mib_per_rank": [200, 210]},
            {"rows": 80, "rule": "buckets", "peak_mib_per_rank": [220, 250]},
            {"rows": 10, "rule": "min-count", "peak_mib_per_rank": [200, 200]},
            {"rows": 80, "rule": "min-count", "peak_mib_per_rank": [260, 240]}]
    s = prep_criteo.summarize(runs, 10, 80)
    assert s["buckets"]["ratio"] == 250 / 210 and s["min-count"]["ratio"] == 1.3
    assert list(s["checks"].values()) == [True, False]
