"""The keyed training reader: each batch slot's key is the sample it holds, resume included."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

from hpcdp.data.read.sample_keys import SampleKeys
from hpcdp.data.read.samples import ShardedReader

N = 1000


@pytest.fixture
def indexed(tmp_path: Path) -> Path:
    """Labels equal to the row index, so each batch says which rows it holds."""
    path = tmp_path / "k.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=np.arange(N * 2, dtype=np.float32).reshape(N, 2),
                         chunks=(37, 2))
        f.create_dataset("y", data=np.arange(N), chunks=(37,))
    return path


@pytest.mark.parametrize("world", [1, 2, 4])
def test_keys_are_the_rows_served_on_every_rank(indexed: Path, world: int) -> None:
    for rank in range(world):
        reader = SampleKeys(ShardedReader(indexed, batch_size=48 // world, rank=rank,
                                          world_size=world, seed=3, window_samples=100))
        for epoch in (0, 1):
            reader.set_epoch(epoch)
            assert len(reader) == N // 48
            batches = list(reader)
            assert len(batches) == N // 48 and len(reader) == 0
            for _, y, k in batches:
                assert (k[:, 1] == y).all() and (k[:, 0] == epoch).all()


def test_keys_after_a_mid_epoch_resume(indexed: Path) -> None:
    reader = SampleKeys(ShardedReader(indexed, batch_size=24, rank=1, world_size=2, seed=3))
    reader.set_epoch(1)
    it = iter(reader)
    for _ in range(5):
        next(it)
    state = reader.state_dict()
    it.close()
    resumed = SampleKeys(ShardedReader(indexed, batch_size=24, rank=1, world_size=2, seed=3))
    resumed.load_state_dict(state)
    resumed.set_epoch(1)
    rest = list(resumed)
    assert len(rest) == N // 48 - 5
    for _, y, k in rest:
        assert (k[:, 1] == y).all() and (k[:, 0] == 1).all()
