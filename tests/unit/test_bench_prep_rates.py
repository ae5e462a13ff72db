"""The Terabyte projection's arithmetic: the work over the cores, or one file's inflating."""

from __future__ import annotations

import pytest

from hpcdp.bench.prep_rates import project


def test_few_cores_are_bound_by_the_work_and_many_by_a_files_inflating() -> None:
    few = project(rows=1200, files=24, cores=2, parse_rate=1.0, inflate_rate=3.0)
    assert few["work_seconds"] == pytest.approx(1200 * (1 + 1 / 3) / 2)
    assert few["inflate_seconds"] == pytest.approx(12 * 50 / 3)  # 12 files in turn a rank
    assert few["seconds"] == few["work_seconds"]
    many = project(rows=1200, files=24, cores=2048, parse_rate=1.0, inflate_rate=3.0)
    assert many["seconds"] == many["inflate_seconds"] == pytest.approx(50 / 3)


def test_more_cores_never_take_longer() -> None:
    times = [project(4.37e9, 24, p, 2e5, 1.4e6)["seconds"] for p in (1, 2, 24, 128, 2048)]
    assert times == sorted(times, reverse=True)
