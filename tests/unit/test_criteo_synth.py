"""The synthetic Criteo-format log: valid lines, rows fixed by (seed, split, index), and an
oracle the true probabilities reach."""

from __future__ import annotations

import numpy as np

from hpcdp.data.prep.clicks import criteo as cr
from hpcdp.data.prep.clicks import criteo_synth as cs


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
