"""A Criteo-format click log with a planted signal, and the best AUC any model can reach on it.

`python -m hpcdp.data.synth.criteo_logs --out DIR` writes DIR/train_0.txt,
DIR/train_1.txt.gz (the training rows in two files, one gzipped), DIR/val.txt
and DIR/oracle.json. Each line is a Criteo row: label, 13 counts (I1..I13), 26
categorical values (C1..C26) as 8 hex digits, some fields empty, a few counts
of I2 negative. The label is drawn as

    click ~ Bernoulli(sigmoid(<user latent, item latent> + item bias + context effect
                              + w . log(1 + max(counts, 0)) - c))

with C1 the user, C2 the item (both with Zipf popularity), C3 a context value
with its own effect, C4..C13 values hashed from the user or the item (no signal
of their own), C14..C26 noise, and the counts drawn log-normally. The dense
part is written on the features exactly as `datasets/criteo.py` computes them
(an empty count is 0, a negative one 0), so the true click probability of each
row is what a model could learn: `oracle.json`'s ``oracle_auc`` is the AUC of
those probabilities against the validation labels. `c` is solved for the
requested click rate. A row depends only on (seed, split, index).

With ``--terabyte-like DAYS`` it writes instead DIR/day_0.txt.. and DIR/val.txt
for measuring preparation at scale: no signal, but vocabularies of the real
logs' sizes (`ScaleSpec`), formatted at C speed (`format_lines`). Scale data is
generated where it is used, never committed.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import math
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from hpcdp.data.prep.clicks import criteo as cr
from hpcdp.data.prep.clicks.synth import sigmoid, zipf_cdf, zipf_draw

#: Rows generated from one seeded stream (fixed: the data never depends on how it is cut).
BLOCK = 1 << 15
SPLITS = {"train": 0, "val": 1}
SIDE = range(3, 13)  # C4..C13 (0-based columns): hashed from the user (even) or item (odd)
NOISE_SIZES = np.geomspace(10, 100_000, cr.CATEGORICAL - 13).round().astype(np.int64)
CONTEXT_VALUES = 40


@dataclass(frozen=True)
class CriteoSynthSpec:
    rows: int = 400_000
    val_rows: int = 50_000
    seed: int = 0
    users: int = 1_000
    items: int = 500
    latent_dim: int = 4
    click_rate: float = 0.25
    empty_rate: float = 0.05


class CriteoSynth:
    """The hidden parameters and the rows of one synthetic log."""

    def __init__(self, spec: CriteoSynthSpec) -> None:
        self.spec = spec
        rng = np.random.default_rng([spec.seed, 2**32])
        scale = math.sqrt(1.2 / math.sqrt(spec.latent_dim))
        self.user_latent = rng.standard_normal((spec.users, spec.latent_dim)) * scale
        self.item_latent = rng.standard_normal((spec.items, spec.latent_dim)) * scale
        self.item_bias = rng.standard_normal(spec.items) * 0.5
        self.context = rng.standard_normal(CONTEXT_VALUES) * 0.4
        self.count_mu = rng.uniform(0.0, 3.0, cr.DENSE)  # log-scale means of the counts
        weight = rng.standard_normal(cr.DENSE)
        self.dense_weight = weight * 0.6 / np.linalg.norm(weight)
        self.user_cdf, self.item_cdf = zipf_cdf(spec.users, 1.05), zipf_cdf(spec.items, 1.05)
        self.noise_cdfs = [zipf_cdf(int(size), 1.05) for size in NOISE_SIZES]
        self.offset = 0.0
        z = self._draw(np.random.default_rng([spec.seed, 2**32 + 1]), 1 << 16)[3]
        lo, hi = float(z.min()) - 20, float(z.max()) + 20
        for _ in range(100):  # bisection: the mean probability falls as the offset grows
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if sigmoid(z - mid).mean() > spec.click_rate else (lo, mid)
        self.offset = 0.5 * (lo + hi)

    def _draw(self, rng: np.random.Generator, n: int
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(counts as drawn, which counts are written empty, raw ids, logits before `c`)."""
        s = self.spec
        counts = np.floor(np.exp(rng.standard_normal((n, cr.DENSE)) + self.count_mu)).astype(
            np.int64)
        counts[rng.random(n) < 0.02, 1] = -1  # a few negative I2, as in the real logs
        dense_empty = rng.random((n, cr.DENSE)) < s.empty_rate
        ids = np.zeros((n, cr.CATEGORICAL), np.int64)
        ids[:, 0] = zipf_draw(rng, self.user_cdf, n)
        ids[:, 1] = zipf_draw(rng, self.item_cdf, n)
        ids[:, 2] = rng.integers(0, CONTEXT_VALUES, n)
        for j in SIDE:
            ids[:, j] = cr.hash_ids(ids[:, j % 2], j, 20 + 40 * j)
        for k, cdf in enumerate(self.noise_cdfs):
            ids[:, 13 + k] = zipf_draw(rng, cdf, n)
        features = cr.dense_features(np.where(dense_empty, 0, counts)).astype(np.float64)
        centred = features - self.count_mu
        logit = (np.einsum("nk,nk->n", self.user_latent[ids[:, 0]], self.item_latent[ids[:, 1]])
                 + self.item_bias[ids[:, 1]] + self.context[ids[:, 2]]
                 + centred @ self.dense_weight)
        return counts, dense_empty, ids, logit

    def block(self, split: str, k: int, n: int) -> tuple[list[bytes], np.ndarray, np.ndarray]:
        """Lines, labels and true probabilities of generation block `k` of `split`."""
        rng = np.random.default_rng([self.spec.seed, SPLITS[split], k])
        counts, dense_empty, ids, logit = self._draw(rng, n)
        prob = sigmoid(logit - self.offset)
        label = (rng.random(n) < prob).astype(np.uint8)
        cat_empty = rng.random((n, cr.CATEGORICAL)) < self.spec.empty_rate
        cat_empty[:, :3] = False  # the user, the item and the context always known
        values = np.stack([cr.hash_ids(ids[:, j], 1000 + j, 2**32) for j in range(cr.CATEGORICAL)],
                          axis=1)
        text = format_lines(label, counts, dense_empty, values, cat_empty)
        lines = text.splitlines(keepends=True)
        return lines, label, prob

    def write(self, split: str, n: int, paths: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """`n` rows of `split`, spread evenly over `paths` (.gz ones gzipped); labels, probs."""
        labels, probs = [], []

        def lines(k: int, rows: int) -> bytes:
            text, label, prob = self.block(split, k, rows)
            labels.append(label)
            probs.append(prob)
            return b"".join(text)

        write_blocks(n, paths, lines)
        return np.concatenate(labels), np.concatenate(probs)


# -- lines at C speed ----------------------------------------------------------------


HEX = np.frombuffer(b"0123456789abcdef", np.uint8)


def format_lines(label: np.ndarray, counts: np.ndarray, dense_empty: np.ndarray,
                 values: np.ndarray, cat_empty: np.ndarray) -> bytes:
    """Criteo lines (each ending in a newline) of n rows: labels, counts (a field written
    empty where `dense_empty`), values in [0, 2**32) as 8 lowercase hex digits (empty where
    `cat_empty`). Each field is laid out in a fixed-width byte column padded with zero
    bytes, and the zero bytes dropped at the end, so no Python runs per row."""
    n = len(label)
    tab = np.full((n, 1), ord("\t"), np.uint8)
    width = max(len(str(int(counts.min(initial=0)))), len(str(int(counts.max(initial=0)))))
    digits = counts.astype(f"S{width}").view(np.uint8).reshape(n, cr.DENSE, width).copy()
    digits[dense_empty] = 0
    shifts = np.arange(28, -1, -4, dtype=np.uint64)
    nibbles = (values.astype(np.uint64)[..., None] >> shifts) & np.uint64(15)
    hexes = HEX[nibbles.astype(np.intp)]
    hexes[cat_empty] = 0
    columns = [(np.asarray(label, np.uint8) + ord("0"))[:, None]]
    columns += [c for j in range(cr.DENSE) for c in (tab, digits[:, j])]
    columns += [c for j in range(cr.CATEGORICAL) for c in (tab, hexes[:, j])]
    table = np.concatenate([*columns, np.full((n, 1), ord("\n"), np.uint8)], axis=1)
    return table[table != 0].tobytes()


# -- Terabyte-like cardinalities --------------------------------------------------------

#: Distinct values each categorical field draws from, of the orders of the Criteo Terabyte
#: logs' (a few fields with 10**8 values, several with 10**4..10**7, the rest small).
TERABYTE_LIKE = (200_000_000, 40_000, 17_000, 7_000, 20_000, 3, 7_000, 1_500, 60,
                 100_000_000, 3_000_000, 400_000, 10, 2_000, 12_000, 150, 4, 1_000, 14,
                 300_000_000, 40_000_000, 200_000_000, 600_000, 13_000, 100, 36)


@dataclass(frozen=True)
class ScaleSpec:
    """Rows for measuring preparation at scale: no planted signal, real-sized vocabularies.

    Field j's value is the hash of k = floor((U_j + 1) ** u) - 1 for u uniform in [0, 1):
    P(k) falls as 1 / (k + 1) over [0, U_j), so the big fields show millions of distinct
    values in a few million rows and keep adding new ones, as the real logs do."""

    seed: int = 0
    click_rate: float = 0.03
    empty_rate: float = 0.05
    cardinalities: tuple[int, ...] = TERABYTE_LIKE


def scale_block(spec: ScaleSpec, split: str, k: int, n: int) -> bytes:
    """The lines of generation block `k` (rows k * BLOCK ..) of `split`."""
    rng = np.random.default_rng([spec.seed, 7 + SPLITS[split], k])
    counts = np.floor(np.exp(rng.standard_normal((n, cr.DENSE)) * 1.5 + 1.0)).astype(np.int64)
    counts[rng.random(n) < 0.02, 1] = -1
    u = rng.random((n, cr.CATEGORICAL))
    sizes = np.asarray(spec.cardinalities, np.float64) + 1
    picks = (np.floor(sizes ** u) - 1).astype(np.int64)
    values = np.stack([cr.hash_ids(picks[:, j], 3000 + j, 2**32) for j in range(cr.CATEGORICAL)],
                      axis=1)
    label = (rng.random(n) < spec.click_rate).astype(np.uint8)
    return format_lines(label, counts, rng.random((n, cr.DENSE)) < spec.empty_rate,
                        values, rng.random((n, cr.CATEGORICAL)) < spec.empty_rate)


def write_scale(spec: ScaleSpec, split: str, n: int, paths: Sequence[str]) -> int:
    """`n` rows of `split` spread evenly over `paths` (.gz ones gzipped); the bytes written."""
    return write_blocks(n, paths, lambda k, rows: scale_block(spec, split, k, rows))


def write_blocks(n: int, paths: Sequence[str], lines: Callable[[int, int], bytes]) -> int:
    """The lines of `n` rows, ``lines(k, rows)`` for each generation block k, spread evenly
    over `paths` (.gz ones gzipped); the bytes written."""
    written = 0
    with contextlib.ExitStack() as stack:
        handles = [stack.enter_context(gzip.open(p, "wb") if p.endswith(".gz")  # noqa: SIM115
                                       else open(p, "wb")) for p in paths]  # noqa: SIM115
        for k in range(-(-n // BLOCK)):
            text = lines(k, min(BLOCK, n - k * BLOCK))
            handles[k * len(handles) * BLOCK // max(n, 1)].write(text)
            written += len(text)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    d = CriteoSynthSpec()
    p = argparse.ArgumentParser(prog="python -m hpcdp.data.synth.criteo_logs",
                                description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    for name, value in asdict(d).items():
        p.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value)
    p.add_argument("--terabyte-like", type=int, metavar="DAYS", default=0,
                   help="instead: --rows rows over DAYS plain files OUT/day_*.txt and "
                        "--val-rows in OUT/val.txt, with Terabyte-like cardinalities and no "
                        "signal (for measuring preparation at scale)")
    args = p.parse_args(argv)
    spec = CriteoSynthSpec(**{k: getattr(args, k) for k in asdict(d)})
    os.makedirs(args.out, exist_ok=True)
    if args.terabyte_like:
        return write_terabyte_like(args.out, spec, args.terabyte_like)
    world = CriteoSynth(spec)
    world.write("train", spec.rows, [os.path.join(args.out, "train_0.txt"),
                                     os.path.join(args.out, "train_1.txt.gz")])
    label, prob = world.write("val", spec.val_rows, [os.path.join(args.out, "val.txt")])
    from sklearn.metrics import roc_auc_score  # lazy: only this command needs it

    oracle = {"oracle_auc": float(roc_auc_score(label, prob)),
              "oracle_logloss": float(-np.mean(label * np.log(prob)
                                               + (1 - label) * np.log1p(-prob))),
              "val_rows": spec.val_rows, "val_click_rate": float(label.mean()),
              "spec": asdict(spec)}
    with open(os.path.join(args.out, "oracle.json"), "w") as fh:
        json.dump(oracle, fh, indent=1)
    print(json.dumps(oracle))
    return 0


def write_terabyte_like(out: str, spec: CriteoSynthSpec, days: int) -> int:
    scale = ScaleSpec(seed=spec.seed, empty_rate=spec.empty_rate)
    days_bytes = write_scale(scale, "train", spec.rows,
                             [os.path.join(out, f"day_{i}.txt") for i in range(days)])
    val_bytes = write_scale(scale, "val", spec.val_rows, [os.path.join(out, "val.txt")])
    print(json.dumps({"train_rows": spec.rows, "train_bytes": days_bytes,
                      "val_rows": spec.val_rows, "val_bytes": val_bytes}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
