"""The synthetic Criteo-format log: valid lines, rows fixed by (seed, split, index), and an
oracle the true probabilities reach."""

from __future__ import annotations

import numpy as np

from hpcdp.data.prep.clicks import criteo as cr
from hpcdp.data.synth import criteo_logs as cs


def test_blocks_are_valid_lines_fixed_by_the_seed() -> None:
    world = cs.CriteoSynth(cs.CriteoSynthSpec(users=40, items=20))
    lines, label, prob = world.block("val", 3, 2000)
    again = cs.CriteoSynth(cs.CriteoSynthSpec(users=40, items=20)).block("val", 3, 2000)[0]
    assert lines == again and lines != world.block("val", 4, 2000)[0]
    rows = cr.parse_lines([line.rstrip(b"\n") for line in lines], "synth")
    assert rows.skipped == 0 and (rows.label == label).all()
    assert (rows.values[:, :3] != cr.EMPTY).all()  # user, item and context always there
    assert 0.01 < (rows.values[:, 13:] == cr.EMPTY).mean() < 0.1
    assert (rows.counts[:, 1] < 0).any() and (rows.counts >= -1).all()
    # the click rate asked for, and probabilities that rank the labels well above chance
    assert abs(prob.mean() - 0.25) < 0.03
    assert prob[label == 1].mean() > prob[label == 0].mean() + 0.1
    assert np.isfinite(prob).all()


def test_format_lines_writes_what_a_row_by_row_formatting_writes() -> None:
    rng = np.random.default_rng(2)
    n = 300
    label = (rng.random(n) < 0.5).astype(np.uint8)
    counts = rng.integers(-3, 10**12, (n, cr.DENSE)) // rng.integers(1, 10**11, (n, cr.DENSE))
    values = rng.integers(0, 2**32, (n, cr.CATEGORICAL))
    values[0, :3] = 0, 2**32 - 1, 15
    dense_empty, cat_empty = rng.random((n, cr.DENSE)) < 0.2, rng.random((n, cr.CATEGORICAL)) < 0.2
    want = b"".join(
        "\t".join([str(label[r]), *("" if dense_empty[r, j] else str(counts[r, j])
                                    for j in range(cr.DENSE)),
                   *("" if cat_empty[r, j] else f"{values[r, j]:08x}"
                     for j in range(cr.CATEGORICAL))]).encode() + b"\n" for r in range(n))
    assert cs.format_lines(label, counts, dense_empty, values, cat_empty) == want


def test_terabyte_like_rows_are_valid_and_keep_bringing_new_values() -> None:
    spec = cs.ScaleSpec()
    text = cs.scale_block(spec, "train", 0, 8_000)
    assert text == cs.scale_block(spec, "train", 0, 8_000) != cs.scale_block(spec, "val", 0,
                                                                              8_000)
    rows = cr.parse_lines(text.splitlines(), "scale")
    assert rows.skipped == 0 and len(rows.label) == 8_000 and 0.02 < rows.label.mean() < 0.04
    big = cs.TERABYTE_LIKE.index(max(cs.TERABYTE_LIKE))
    half = [len(np.unique(rows.values[:k, big])) for k in (4_000, 8_000)]
    assert half[1] > 1.6 * half[0] > 4_000  # most values of the big fields are new
    assert len(np.unique(rows.values[:, 5])) <= 4  # C6: 3 values and the empty one
