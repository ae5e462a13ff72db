"""The click model learns the planted signal: well above item popularity, near the oracle.

Small on purpose (about 7 s of CPU): 20,000 rows, 50 users, 30 items, 3 epochs.
The figures at the default size are in docs/recsys.md.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from hpcdp.data.prep.clicks import recipe as clicks_prep
from hpcdp.tasks.recsys_check import CheckOptions, run


@pytest.fixture
def one_thread() -> Iterator[None]:
    """One compute thread, as a training rank runs (two threads on a loaded 2-core machine
    spend most of their time waiting for each other)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.slow
def test_the_model_beats_popularity_and_nears_the_oracle(tmp_path: Path, one_thread: None) -> None:
    args = ["--rows", "20000", "--val-rows", "5000", "--users", "50", "--items", "30",
            "--max-table", "1000", "--latent-dim", "2", "--seed", "5"]
    assert clicks_prep.main(["--out", str(tmp_path), *args]) == 0
    got = run(tmp_path, CheckOptions(seconds=float("inf"), max_epochs=3, batch=128))
    assert got["oracle_auc"] > got["baseline_auc"] + 0.1  # the signal is more than popularity
    assert got["val_auc"] > got["baseline_auc"] + 0.08, got
    assert got["val_auc"] > got["oracle_auc"] - 0.04, got
