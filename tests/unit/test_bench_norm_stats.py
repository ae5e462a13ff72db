"""The pure summary of hpcdp.bench.norm_stats (the timing itself runs under mpirun)."""

from __future__ import annotations

import pytest

from hpcdp.bench.norm_stats import summarize


def test_bench_ratio_is_the_median_of_per_block_ratios() -> None:
    got = summarize([(11.0, 10.0), (30.0, 10.0), (9.0, 10.0)])
    assert got["ratio"] == 1.1 and got["on_step_ms"] == 11.0 and got["blocks"] == 3
    with pytest.raises(ValueError):
        summarize([])
