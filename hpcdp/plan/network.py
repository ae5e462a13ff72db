"""The network model's inputs: alpha and beta per level, fitted or from a site profile (pure).

Fitted from `hpcdp bench allreduce` JSON: on p ranks a ring all-reduce of n
bytes takes a + b n with a = 2(p-1) alpha and b = 2(p-1)/p beta (the reduction's
cost per byte folds into beta), so a line through (bytes, median seconds) gives
both. Run the benchmark within one node for the `intra` level and
with one rank on each of two nodes for `inter`.

A site profile states them instead (hpcdp.cluster.sites, table [network]):
  intra_latency_us, intra_gbytes_per_s   within a node (NVLink, shared memory)
  inter_latency_us, inter_gbytes_per_s   between nodes, per rank's share of the NIC
  reduce_gbytes_per_s                    the reduction's rate (optional; 0: free)
  hierarchical                           reduce within the node first (default true)
  ranks_per_node                         ranks (GPUs) per node
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hpcdp.plan.model import Link, Network

#: The columns of `hpcdp bench allreduce` that a fit prefers, first found first: the
#: in-place all-reduce training's buckets make, then the raw MPI reference.
FIT_COLUMNS = ("hvd_", "hvd_avg", "hvd", "mpi_", "mpi")


class NetworkError(ValueError):
    """Inputs that cannot give a network model."""


@dataclass(frozen=True)
class Fit:
    """A link fitted from measurements, and where it came from (for the assumptions)."""

    link: Link
    ranks: int
    column: str
    config: str
    sizes: tuple[int, ...]
    worst_error: float  # the largest relative residual of the line at a measured size


def line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """(intercept, slope) of ys against xs, least squares in relative error (weights 1/y^2):
    sizes span five orders of magnitude, and a plain fit would let the largest decide the
    latency that the smallest measure."""
    n = len(xs)
    if n < 2 or n != len(ys):
        raise NetworkError(f"a line needs at least two points, got {n} sizes")
    if min(ys) <= 0:
        raise NetworkError("times must be positive")
    w = [1 / y**2 for y in ys]
    sw = sum(w)
    mx, my = sum(wi * x for wi, x in zip(w, xs)) / sw, sum(wi * y for wi, y in zip(w, ys)) / sw
    sxx = sum(wi * (x - mx) ** 2 for wi, x in zip(w, xs))
    if sxx == 0:
        raise NetworkError("a line needs at least two different sizes")
    slope = sum(wi * (x - mx) * (y - my) for wi, x, y in zip(w, xs, ys)) / sxx
    return my - slope * mx, slope


def fit_allreduce(payload: Mapping[str, Any], column: str | None = None,
                  config: str | None = None, where: str = "allreduce JSON") -> Fit:
    """alpha and beta from one configuration's rows of an `hpcdp bench allreduce` result."""
    ranks = payload.get("np")
    rows = payload.get("rows")
    if not isinstance(ranks, int) or ranks < 2 or not isinstance(rows, list):
        raise NetworkError(f"{where}: not an `hpcdp bench allreduce` result (needs 'np' >= 2 "
                           "and 'rows')")
    configs = list(dict.fromkeys(r.get("config") for r in rows))
    config = config or ("mpi-hpcdp" if "mpi-hpcdp" in configs else configs[0] if configs else "")
    mine = [r for r in rows if r.get("config") == config]
    if not mine:
        raise NetworkError(f"{where}: no rows of configuration {config!r} (has {configs})")
    have = {r["column"] for r in mine}
    column = column or next((c for c in FIT_COLUMNS if c in have), None)
    if column not in have:
        raise NetworkError(f"{where}: configuration {config!r} has no column {column!r} "
                           f"(has {sorted(have)})")
    points = sorted((int(r["bytes"]), float(r["seconds_median"]))
                    for r in mine if r["column"] == column)
    xs, ys = [float(b) for b, _ in points], [s for _, s in points]
    a, b = line(xs, ys)
    a, b = max(a, 0.0), max(b, 0.0)  # a noisy fit may cross zero: no negative latency
    steps = ranks - 1
    link = Link(alpha_s=a / (2 * steps), beta_s_per_byte=b * ranks / (2 * steps))
    worst = max(abs(a + b * x - y) / y for x, y in zip(xs, ys))
    return Fit(link, ranks, column, config, tuple(int(x) for x in xs), worst)


NETWORK_KEYS = ("intra_latency_us", "intra_gbytes_per_s", "inter_latency_us",
                "inter_gbytes_per_s", "reduce_gbytes_per_s", "hierarchical", "ranks_per_node")


def _link(profile: Mapping[str, Any], level: str, gamma: float, where: str) -> Link | None:
    lat = profile.get(f"network.{level}_latency_us")
    bw = profile.get(f"network.{level}_gbytes_per_s")
    if lat is None and bw is None:
        return None
    if lat is None or bw is None:
        raise NetworkError(f"{where}: [network] needs both {level}_latency_us and "
                           f"{level}_gbytes_per_s")
    if bw <= 0:
        raise NetworkError(f"{where}: network.{level}_gbytes_per_s must be positive")
    return Link(lat * 1e-6, 1e-9 / bw, gamma)


def from_site(profile: Mapping[str, Any], where: str = "site profile") -> tuple[Link | None,
                                                                              Link | None,
                                                                              dict[str, Any]]:
    """(intra, inter, other settings) a validated profile's [network] table gives; a level
    it does not state is None."""
    reduce = profile.get("network.reduce_gbytes_per_s")
    gamma = 1e-9 / reduce if reduce else 0.0
    other = {k: profile[f"network.{k}"] for k in ("hierarchical", "ranks_per_node")
             if f"network.{k}" in profile}
    return (_link(profile, "intra", gamma, where), _link(profile, "inter", gamma, where), other)


def network(intra: Link | None, inter: Link | None, hierarchical: bool = True) -> Network:
    """Both levels; one given alone stands for the other too (said in the assumptions)."""
    if intra is None and inter is None:
        raise NetworkError("no network model: give --allreduce JSON (a fit) or a site profile "
                           "with a [network] table")
    return Network(intra or inter, inter or intra, hierarchical)  # type: ignore[arg-type]
