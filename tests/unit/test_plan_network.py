"""hpcdp.plan.network: alpha and beta fitted from benchmark rows, or read from a site profile."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcdp.cluster import sites
from hpcdp.plan import network


def rows(ranks: int, alpha: float, beta: float, sizes=(4096, 1 << 20, 64 << 20)) -> dict:
    """Benchmark rows that follow the ring formula exactly."""
    steps = ranks - 1
    return {"np": ranks, "rows": [
        {"config": "mpi-hpcdp", "column": "hvd_", "bytes": n,
         "seconds_median": 2 * steps * alpha + 2 * steps / ranks * n * beta} for n in sizes]}


@pytest.mark.parametrize("ranks", [2, 4])
def test_fit_recovers_alpha_and_beta(ranks: int) -> None:
    fit = network.fit_allreduce(rows(ranks, 20e-6, 1 / 2e9))
    assert fit.link.alpha_s == pytest.approx(20e-6)
    assert fit.link.beta_s_per_byte == pytest.approx(1 / 2e9)
    assert fit.link.gbytes_per_s == pytest.approx(2.0)
    assert fit.column == "hvd_" and fit.config == "mpi-hpcdp" and fit.worst_error < 1e-9


def test_fit_names_what_is_missing() -> None:
    with pytest.raises(network.NetworkError, match="column 'mpi'"):
        network.fit_allreduce(rows(2, 1e-5, 1e-9), column="mpi")
    with pytest.raises(network.NetworkError, match="not an `hpcdp bench allreduce` result"):
        network.fit_allreduce({"np": 1, "rows": []})
    with pytest.raises(network.NetworkError, match="two"):
        network.fit_allreduce(rows(2, 1e-5, 1e-9, sizes=(4096,)))


def test_site_network_table(tmp_path: Path) -> None:
    path = tmp_path / "x.toml"
    path.write_text("[network]\nintra_latency_us = 2\nintra_gbytes_per_s = 100\n"
                    "inter_latency_us = 5.5\ninter_gbytes_per_s = 25\nranks_per_node = 4\n"
                    "hierarchical = false\n")
    profile = sites.load(path)
    intra, inter, other = network.from_site(profile)
    assert (intra.alpha_s, inter.alpha_s) == pytest.approx((2e-6, 5.5e-6))
    assert (intra.gbytes_per_s, inter.gbytes_per_s) == pytest.approx((100, 25))
    assert other == {"hierarchical": False, "ranks_per_node": 4}
    assert sites.to_options(profile) == {}  # no render() option


@pytest.mark.parametrize("text, match", [
    ("[network]\ninter_gbps = 1\n", "did you mean 'network.inter_gbytes_per_s'"),
    ("[network]\ninter_latency_us = -1\n", "a number not below 0"),
    ("[network]\nranks_per_node = 0\n", "a positive integer"),
    ("[network]\nhierarchical = 1\n", "true or false"),
])
def test_site_network_table_refuses(tmp_path: Path, text: str, match: str) -> None:
    path = tmp_path / "x.toml"
    path.write_text(text)
    with pytest.raises(sites.SiteError, match=match):
        sites.load(path)


def test_one_level_needs_both_keys(tmp_path: Path) -> None:
    path = tmp_path / "x.toml"
    path.write_text("[network]\ninter_latency_us = 3\n")
    with pytest.raises(network.NetworkError, match="inter_gbytes_per_s"):
        network.from_site(sites.load(path))


def test_line_weights_relative_error() -> None:
    # Exact points are recovered whatever the weights; noisy ones: the small size's time
    # decides the intercept (a plain fit would give a negative one here).
    a, b = network.line([1.0, 10.0, 1e6], [2.0, 2.9, 1e5 + 2])
    assert a == pytest.approx(2.0, rel=0.1) and b == pytest.approx(0.1, rel=1e-3)
