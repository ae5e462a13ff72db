"""A synthetic click log with a planted signal: rows, their true click probability, no I/O.

Each row is an impression: 13 dense float features, 26 categorical ids (a user,
an item, 12 side features hashed from the user or the item, 12 context features
drawn on their own) and a click label drawn as

    click ~ Bernoulli(sigmoid(<user latent, item latent> + w . dense + item bias - c))

Users, items and context values are drawn with Zipf popularity (id 0 the most
popular); the item bias grows with the item's popularity, so that popularity
alone ranks clicks better than chance but far from the best possible. `c` is
solved once from a calibration sample for the requested click rate. Since the
true probability of every row is known, the best AUC any model can reach on a
split (`oracle_auc`) is known too.

A row's content depends only on the seed, the split and its index: rows are
generated in fixed blocks of `GEN_ROWS`, each from its own seeded stream, so
any number of writers, each asking for its own row range, produce the same file.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from functools import cached_property
from typing import Any

import numpy as np

from hpcdp.data.prep.clicks.criteo import hash_ids

#: Rows generated together from one seeded stream (fixed, so data never depends on slabs).
GEN_ROWS = 8192
#: Rows drawn to solve for the offset `c` that gives the requested click rate.
CALIBRATION_ROWS = 1 << 16
DENSE_FEATURES = 13
SIDE_FIELDS = 12  # hashed from the user (even) or the item (odd)
CONTEXT_FIELDS = 12  # drawn on their own: no signal
SPLITS = {"train": 0, "val": 1}
#: Scales of the three parts of the logit (standard deviations, before `c`).
LATENT_STD = 1.2
DENSE_STD = 0.6
ITEM_BIAS_STD = 0.5
#: Share of the item bias's variance explained by the item's log popularity.
BIAS_FROM_POPULARITY = 0.6


class ClickSpecError(ValueError):
    """Options that describe no valid click log (the message names the option)."""


@dataclass(frozen=True)
class ClickSpec:
    """Everything the log depends on; stored in the files as `source_params`."""

    rows: int = 600_000
    val_rows: int = 50_000
    seed: int = 0
    users: int = 1_000
    items: int = 500
    min_table: int = 10
    max_table: int = 100_000
    latent_dim: int = 4
    zipf: float = 1.05
    click_rate: float = 0.25

    def check(self) -> ClickSpec:
        positive = {"--rows": self.rows, "--users": self.users, "--items": self.items,
                    "--min-table": self.min_table, "--latent-dim": self.latent_dim}
        for name, value in positive.items():
            if value < 1:
                raise ClickSpecError(f"{name} must be at least 1, got {value}")
        if self.val_rows < 0 or self.seed < 0:
            raise ClickSpecError("--val-rows and --seed must be non-negative")
        if self.max_table < self.min_table:
            raise ClickSpecError(
                f"--max-table {self.max_table} is below --min-table {self.min_table}")
        if max(self.users, self.items, self.max_table) >= 2**31:
            raise ClickSpecError("tables must hold fewer than 2**31 rows (ids are int32)")
        if not 0.0 < self.zipf <= 4.0:
            raise ClickSpecError(f"--zipf must be in (0, 4], got {self.zipf}")
        if not 0.01 <= self.click_rate <= 0.99:
            raise ClickSpecError(f"--click-rate must be in [0.01, 0.99], got {self.click_rate}")
        return self

    def params(self) -> dict[str, Any]:
        return asdict(self)


def field_names() -> list[str]:
    """The 26 categorical fields, in column order of the `sparse` dataset."""
    side = [f"{'user' if j % 2 == 0 else 'item'}_side_{j}" for j in range(SIDE_FIELDS)]
    return ["user", "item", *side, *(f"context_{j}" for j in range(CONTEXT_FIELDS))]


def side_table_sizes(count: int, smallest: int, largest: int) -> list[int]:
    """`count` table sizes spread geometrically from `smallest` to `largest`."""
    if count == 1:
        return [largest]
    ratio = (largest / smallest) ** (1.0 / (count - 1))
    return [int(round(smallest * ratio**k)) for k in range(count)]


def table_sizes(spec: ClickSpec) -> list[int]:
    """Rows of each field's table: users, items, then side and context fields alternately
    taking the geometric sizes, so both kinds range from small to large tables."""
    sizes = side_table_sizes(SIDE_FIELDS + CONTEXT_FIELDS, spec.min_table, spec.max_table)
    side, context = sizes[0::2], sizes[1::2]
    return [spec.users, spec.items, *side, *context]


def _rng(*key: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(list(key))))


def zipf_cdf(n: int, exponent: float) -> np.ndarray:
    """Cumulative probabilities of ids 0..n-1 under p(k) ~ 1 / (k + 1) ** exponent."""
    weights = 1.0 / np.arange(1, n + 1, dtype=np.float64) ** exponent
    cdf = np.cumsum(weights)
    return cdf / cdf[-1]


def zipf_draw(rng: np.random.Generator, cdf: np.ndarray, size: int) -> np.ndarray:
    """`size` ids drawn with the popularity `cdf` (inverse-CDF sampling)."""
    ids = np.searchsorted(cdf, rng.random(size), side="right")
    return np.minimum(ids, len(cdf) - 1).astype(np.int64)


def sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))


@dataclass(frozen=True)
class Rows:
    """Rows [start, stop) of one split."""

    dense: np.ndarray  # (n, 13) float32
    sparse: np.ndarray  # (n, 26) int32
    label: np.ndarray  # (n,) uint8, 0 or 1
    prob: np.ndarray  # (n,) float64, the true click probability
    popularity: np.ndarray  # (n,) float64, the item's impression probability


class ClickWorld:
    """The hidden parameters of the log (latents, weights, biases, offset) and its rows."""

    def __init__(self, spec: ClickSpec) -> None:
        self.spec = spec.check()
        self.sizes = table_sizes(spec)
        rng = _rng(spec.seed, 2**32)
        scale = math.sqrt(LATENT_STD / math.sqrt(spec.latent_dim))
        self.user_latent = rng.standard_normal((spec.users, spec.latent_dim)) * scale
        self.item_latent = rng.standard_normal((spec.items, spec.latent_dim)) * scale
        self.dense_weight = rng.standard_normal(DENSE_FEATURES)
        self.dense_weight *= DENSE_STD / np.linalg.norm(self.dense_weight)
        self.item_popularity = np.diff(zipf_cdf(spec.items, spec.zipf), prepend=0.0)
        log_pop = np.log(self.item_popularity)
        z_pop = (log_pop - log_pop.mean()) / max(log_pop.std(), 1e-12)
        noise = rng.standard_normal(spec.items)
        self.item_bias = ITEM_BIAS_STD * (math.sqrt(BIAS_FROM_POPULARITY) * z_pop
                                          + math.sqrt(1 - BIAS_FROM_POPULARITY) * noise)
        self.offset = 0.0

    @cached_property
    def _cdfs(self) -> dict[int, np.ndarray]:
        """Popularity of each drawn field (users, items, context fields) by column."""
        spec = self.spec
        drawn = [0, 1, *range(2 + SIDE_FIELDS, 2 + SIDE_FIELDS + CONTEXT_FIELDS)]
        return {col: zipf_cdf(self.sizes[col], spec.zipf) for col in drawn}

    def calibrate(self) -> ClickWorld:
        """Solve the offset `c` so that the mean click probability is the requested rate."""
        z = self._logits(self._draw(_rng(self.spec.seed, 2**32 + 1), CALIBRATION_ROWS)[:2])
        lo, hi = float(z.min()) - 20.0, float(z.max()) + 20.0
        for _ in range(100):  # bisection: the mean probability falls as c grows
            mid = 0.5 * (lo + hi)
            if sigmoid(z - mid).mean() > self.spec.click_rate:
                lo = mid
            else:
                hi = mid
        self.offset = 0.5 * (lo + hi)
        return self

    def _draw(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Dense features and categorical ids of `n` rows."""
        dense = rng.standard_normal((n, DENSE_FEATURES), dtype=np.float32)
        sparse = np.empty((n, len(self.sizes)), np.int64)
        for col, cdf in self._cdfs.items():
            sparse[:, col] = zipf_draw(rng, cdf, n)
        for j in range(SIDE_FIELDS):
            owner = sparse[:, j % 2]  # the user (even j) or the item (odd j)
            sparse[:, 2 + j] = hash_ids(owner, j + 1, self.sizes[2 + j])
        return dense, sparse

    def _logits(self, parts: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
        dense, sparse = parts
        users, items = sparse[:, 0], sparse[:, 1]
        dot = np.einsum("nk,nk->n", self.user_latent[users], self.item_latent[items])
        return dot + dense.astype(np.float64) @ self.dense_weight + self.item_bias[items]

    def block(self, split: str, k: int, n: int) -> Rows:
        """The `n` rows of generation block `k` of `split` (n < GEN_ROWS for a last block)."""
        rng = _rng(self.spec.seed, SPLITS[split], k)
        dense, sparse = self._draw(rng, n)
        prob = sigmoid(self._logits((dense, sparse)) - self.offset)
        label = (rng.random(n) < prob).astype(np.uint8)
        return Rows(dense, sparse.astype(np.int32), label, prob,
                    self.item_popularity[sparse[:, 1]])

    def rows(self, split: str, start: int, stop: int) -> Rows:
        """Rows [start, stop) of `split`, the same whichever way a file is cut into slabs."""
        total = self.spec.rows if split == "train" else self.spec.val_rows
        if not 0 <= start <= stop <= total:
            raise ClickSpecError(f"rows [{start}, {stop}) outside the {total} rows of {split}")
        parts = []
        for k in range(start // GEN_ROWS, -(-stop // GEN_ROWS)):
            lo = k * GEN_ROWS
            blk = self.block(split, k, min(GEN_ROWS, total - lo))
            a, b = max(start, lo) - lo, min(stop, lo + GEN_ROWS) - lo
            parts.append(Rows(*(getattr(blk, f.name)[a:b] for f in fields(Rows))))
        if len(parts) == 1:
            return parts[0]
        if not parts:
            return Rows(np.zeros((0, DENSE_FEATURES), np.float32),
                        np.zeros((0, len(self.sizes)), np.int32), np.zeros(0, np.uint8),
                        np.zeros(0), np.zeros(0))
        return Rows(*(np.concatenate([getattr(p, f.name) for p in parts]) for f in fields(Rows)))


def reference_aucs(label: np.ndarray, prob: np.ndarray, popularity: np.ndarray) -> dict[str, float]:
    """`oracle_auc` (true probabilities) and `baseline_auc` (item popularity alone)."""
    from sklearn.metrics import roc_auc_score

    if label.min() == label.max():
        return {"oracle_auc": float("nan"), "baseline_auc": float("nan")}
    return {"oracle_auc": float(roc_auc_score(label, prob)),
            "baseline_auc": float(roc_auc_score(label, popularity))}
