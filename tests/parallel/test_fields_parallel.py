"""Row-aligned fields on two real MPI ranks: the global order, then resume on one rank."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hpcdp.data.read import order as pt
from hpcdp.data.read.multi_field import FieldReader

pytestmark = pytest.mark.parallel

N, CHUNK = 1000, 16


def test_two_ranks_then_one_rank_read_one_epoch_once(fields_file, ranks, tmp_path: Path) -> None:
    path = fields_file(tmp_path / "c.h5")
    out = tmp_path / "two"
    ranks("fields_reader", str(path), "--seed", "6", "--window", "24", "--steps", "9",
          "--out", str(out), np=2, timeout=120)
    head = np.load(f"{out}.npy")
    state = json.loads(Path(f"{out}.json").read_text())
    whole = pt.global_order(N, CHUNK, 6, 1, 48, 24, 24)
    np.testing.assert_array_equal(head, whole[:9])
    # Resume the 2-rank state on one rank (same global batch): the rest of the epoch.
    with FieldReader(path, ("dense", "sparse", "label"), batch_size=48, seed=6) as one:
        one.load_state_dict(state)
        one.set_epoch(1)
        rest = [sparse[:, 0].numpy() for _, sparse, _ in one]
    np.testing.assert_array_equal(np.concatenate([head, np.stack(rest)]), whole)
