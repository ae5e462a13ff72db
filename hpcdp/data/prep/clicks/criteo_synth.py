"""A Criteo-format click log with a planted signal, and the best AUC any model can reach on it.

`python -m hpcdp.data.prep.clicks.criteo_synth --out DIR` writes DIR/train_0.txt,
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
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import math
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import IO

import numpy as np

from hpcdp.data.prep.clicks import criteo as cr
from hpcdp.data.prep.clicks.synth import hash_ids, sigmoid, zipf_cdf, zipf_draw

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
            ids[:, j] = hash_ids(ids[:, j % 2], j, 20 + 40 * j)
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
        values = np.stack([hash_ids(ids[:, j], 1000 + j, 2**32) for j in range(cr.CATEGORICAL)],
                          axis=1)
        lines = []
        for r in range(n):
            dense = ["" if dense_empty[r, j] else str(counts[r, j]) for j in range(cr.DENSE)]
            cats = ["" if cat_empty[r, j] else f"{values[r, j]:08x}"
                    for j in range(cr.CATEGORICAL)]
            lines.append("\t".join([str(label[r]), *dense, *cats]).encode() + b"\n")
        return lines, label, prob

    def write(self, split: str, n: int, paths: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """`n` rows of `split`, spread evenly over `paths` (.gz ones gzipped); labels, probs."""
        labels, probs = [], []
        with contextlib.ExitStack() as stack:
            handles = [stack.enter_context(_open_for_writing(p)) for p in paths]
            for k in range(-(-n // BLOCK)):
                lines, label, prob = self.block(split, k, min(BLOCK, n - k * BLOCK))
                handles[k * len(handles) * BLOCK // max(n, 1)].writelines(lines)
                labels.append(label)
                probs.append(prob)
        return np.concatenate(labels), np.concatenate(probs)


def _open_for_writing(path: str) -> IO[bytes]:
    return gzip.open(path, "wb") if path.endswith(".gz") else open(path, "wb")  # noqa: SIM115


def main(argv: Sequence[str] | None = None) -> int:
    d = CriteoSynthSpec()
    p = argparse.ArgumentParser(prog="python -m hpcdp.data.prep.clicks.criteo_synth",
                                description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    for name, value in asdict(d).items():
        p.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value)
    args = p.parse_args(argv)
    spec = CriteoSynthSpec(**{k: getattr(args, k) for k in asdict(d)})
    os.makedirs(args.out, exist_ok=True)
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


if __name__ == "__main__":
    sys.exit(main())
