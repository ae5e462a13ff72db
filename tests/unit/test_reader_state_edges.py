"""Resuming a reader at its edges: the stored layout wins, and each bound of a state.

Each test pins down a behaviour that mutation testing (`make mutate`) found
unguarded: a stored window or virtual-shard count ignored, a bound off by one.
"""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

from hpcdp.data.read import order as pt
from hpcdp.data.read.samples import ReaderError, ShardedReader

N = 1000


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """y[i] = i, in chunks of 16 rows."""
    path = tmp_path_factory.mktemp("reader") / "d.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=np.arange(N, dtype=np.float32)[:, None], chunks=(16, 1))
        f.create_dataset("y", data=np.arange(N, dtype=np.int64), chunks=(16,))
    return path


def labels(reader: ShardedReader) -> np.ndarray:
    return np.stack([y.numpy() for _, y in reader])


def state(**changes: int) -> dict[str, int]:
    """A valid mid-epoch state: 24 streams of 40 (20 steps of 48), 10 taken from each."""
    base = {"seed": 3, "epoch": 1, "num_samples": N, "block": 16, "virtual_shards": 24,
            "stream_length": 40, "window": 40, "position": 10, "order": pt.ORDER_VERSION}
    return base | changes


def test_the_stored_window_and_virtual_shards_win(data: Path) -> None:
    with ShardedReader(data, batch_size=24, seed=0, window_samples=13, virtual_shards=8,
                       prefetch=0) as r:
        r.load_state_dict(state())
        assert (r.window, r.virtual_shards) == (40, 24)
        got = labels(r)
        assert r.state_dict() == state(position=40)
    np.testing.assert_array_equal(got, pt.global_order(N, 16, 3, 1, 24, 24, 40, position=10,
                                                       stream_len=40))


def load(data: Path, st: dict[str, int], batch_size: int = 24) -> ShardedReader:
    r = ShardedReader(data, batch_size=batch_size, prefetch=0)
    r.load_state_dict(st)
    return r


def refused(data: Path, st: dict[str, int], batch_size: int = 24) -> str:
    with pytest.raises(ReaderError) as err:
        load(data, st, batch_size)
    return str(err.value)


def test_missing_keys_are_listed(data: Path) -> None:
    st = state()
    del st["window"], st["seed"]
    assert refused(data, st) == f"{data}: reader state lacks seed, window"


@pytest.mark.parametrize("v", [0, 5, 48])
def test_virtual_shards_that_cannot_split_the_batch(data: Path, v: int) -> None:
    assert "cannot resume" in refused(data, state(virtual_shards=v))


def test_virtual_shards_must_split_over_the_ranks(data: Path) -> None:
    with pytest.raises(ReaderError, match="the world size must divide 3"):
        ShardedReader(data, batch_size=12, rank=0, world_size=2).load_state_dict(
            state(virtual_shards=3, stream_length=40))


def test_smallest_valid_values_load(data: Path) -> None:
    r = load(data, state(virtual_shards=1, stream_length=1, window=1, position=0, seed=0,
                         epoch=0))
    assert (r.virtual_shards, r.window, len(r)) == (1, 1, 0)
    r = load(data, state(virtual_shards=8, stream_length=125, position=125))  # 8 x 125 = N
    assert len(r) == 0


@pytest.mark.parametrize("bad", [{"window": 0}, {"seed": -1}, {"epoch": -1}])
def test_invalid_window_seed_or_epoch(data: Path, bad: dict[str, int]) -> None:
    assert refused(data, state(**bad)) == (
        f"{data}: reader state has an invalid window, seed or epoch")


@pytest.mark.parametrize("length", [0, 42])
def test_stream_length_must_fit_the_file(data: Path, length: int) -> None:
    assert refused(data, state(stream_length=length, position=0)) == (
        f"{data}: reader state stream length {length} x 24 streams does not fit {N} samples")


def test_position_bounds(data: Path) -> None:
    assert len(load(data, state(position=40))) == 0  # the end of the epoch
    assert refused(data, state(position=41)) == (
        f"{data}: reader state position 41 is outside its stream of 40")


def test_an_older_order_resumes_only_at_an_epoch_end(data: Path) -> None:
    assert len(load(data, state(order=1, position=40))) == 0
    assert len(load(data, state(order=1, position=0))) == 40
    msg = refused(data, state(order=1, position=39))
    assert msg.endswith("resume from a checkpoint taken at the end of an epoch, or with the "
                        "hpcdp version that wrote this one")
