"""The sharded reader on one process: order, content, resume, threads, processes."""

from __future__ import annotations

import multiprocessing as mp
import pickle
import threading
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from hpcdp.data.read import order as pt
from hpcdp.data.read.samples import ReaderError, ShardedReader


def read_all(reader: ShardedReader, steps: int | None = None) -> np.ndarray:
    out = []
    for j, (x, y) in enumerate(reader):
        assert y is not None
        np.testing.assert_array_equal(x[:, 0].numpy(), y.numpy())  # content follows the label
        out.append(y.numpy())
        if steps is not None and j + 1 == steps:
            break
    return np.stack(out) if out else np.zeros((0, reader.batch_size), np.int64)


@pytest.fixture
def data(samples_file, tmp_path: Path) -> Path:
    return samples_file(tmp_path / "d.h5", 1000)


def test_one_rank_reads_the_global_order(data: Path) -> None:
    with ShardedReader(data, batch_size=48, seed=5, window_samples=40) as r:
        assert r.virtual_shards == 24 and r.steps_per_epoch == 1000 // 48 == len(r)
        got = read_all(r)
        assert len(r) == 0
    np.testing.assert_array_equal(got, pt.global_order(1000, 16, 5, 0, 48, 24, 40))


@pytest.mark.parametrize("world", [2, 3, 4])
def test_ranks_split_each_global_batch(data: Path, world: int) -> None:
    ref = pt.global_order(1000, 16, 5, 3, 48, 24, 40)
    parts = []
    for rank in range(world):
        with ShardedReader(data, batch_size=48 // world, rank=rank, world_size=world, seed=5,
                           window_samples=40) as r:
            r.set_epoch(3)
            parts.append(read_all(r))
    assert {p.shape for p in parts} == {(ref.shape[0], 48 // world)}
    np.testing.assert_array_equal(np.concatenate(parts, axis=1), ref)


def test_dtypes_shapes_and_no_labels(samples_file, tmp_path: Path) -> None:
    path = samples_file(tmp_path / "u8.h5", 300, dtype="uint8", x_name="img", y_name="lab")
    with ShardedReader(path, batch_size=10, x_name="img", y_name="lab") as r:
        assert (r.num_samples, r.sample_shape, r.dtype) == (300, (2, 3), np.dtype("uint8"))
        x, y = next(iter(r))
        assert x.dtype == torch.uint8 and x.shape == (10, 2, 3)
        assert y is not None and y.dtype == torch.int64
        np.testing.assert_array_equal(x[:, 0, 0].numpy(), y.numpy() % 251)
    with ShardedReader(path, batch_size=10, x_name="img", y_name=None, prefetch=0) as r:
        batches = list(r)
        assert len(batches) == 30 and all(y is None for _, y in batches)


def test_unchunked_dataset_and_transform(samples_file, tmp_path: Path) -> None:
    path = samples_file(tmp_path / "flat.h5", 200, chunk=None)
    with ShardedReader(path, batch_size=8, transform=lambda x: x * 2) as r:
        x, y = next(iter(r))
        np.testing.assert_array_equal(x[:, 0].numpy(), 2 * y.numpy())


def test_epochs_differ_and_set_epoch_restarts(data: Path) -> None:
    with ShardedReader(data, batch_size=24) as r:
        e0 = read_all(r)
        assert len(r) == 0
        r.set_epoch(1)
        assert len(r) == r.steps_per_epoch
        e1 = read_all(r)
        r.set_epoch(0)
        np.testing.assert_array_equal(read_all(r), e0)
    assert not np.array_equal(e0, e1)
    assert len(np.unique(e1)) == e1.size == e0.size


@pytest.mark.parametrize("stop_after", [0, 1, 7, 20])
def test_resume_mid_epoch_is_exact(data: Path, stop_after: int) -> None:
    with ShardedReader(data, batch_size=24, seed=9, prefetch=3) as r:
        r.set_epoch(2)
        full = read_all(r)
    with ShardedReader(data, batch_size=24, seed=9, prefetch=3) as r:
        r.set_epoch(2)
        first = read_all(r, steps=stop_after) if stop_after else np.zeros((0, 24), np.int64)
        state = r.state_dict()
    assert state["position"] == stop_after * (24 // r.virtual_shards)
    with ShardedReader(data, batch_size=24, seed=0) as r2:  # the state's seed wins
        r2.load_state_dict(state)
        r2.set_epoch(2)  # the loaded epoch: keeps the position
        assert len(r2) == full.shape[0] - stop_after
        rest = read_all(r2)
    np.testing.assert_array_equal(np.concatenate([first, rest]), full)


def test_resume_from_4_ranks_into_2(data: Path) -> None:
    """Checkpointed with 4 ranks x 12, resumed with 2 ranks x 24 and 2 ranks x 36."""
    readers = [ShardedReader(data, batch_size=12, rank=r, world_size=4, seed=1) for r in range(4)]
    first = np.concatenate([read_all(r, steps=5) for r in readers], axis=1)
    states = [r.state_dict() for r in readers]
    assert all(s == states[0] for s in states)
    for r in readers:
        r.close()
    ref = pt.global_order(1000, 16, 1, 0, 48, 24, readers[0].window)
    np.testing.assert_array_equal(first, ref[:5])
    for b in (24, 36):
        parts = []
        for rank in range(2):
            with ShardedReader(data, batch_size=b, rank=rank, world_size=2) as r:
                r.load_state_dict(states[0])
                parts.append(read_all(r))
        rest = np.concatenate(parts, axis=1)
        seen = np.concatenate([first.ravel(), rest.ravel()])
        assert len(np.unique(seen)) == len(seen)
        # 1000 // 48 = 20 steps of 48 fill 24 streams of 40; 5 steps took 10 of each, and
        # the 30 left split into whole steps of 24 or 36 (u = 2 or 3): only the 40 samples
        # past the last global batch of the epoch are left out.
        assert 1000 - len(seen) == 1000 - 20 * 48
        want = pt.global_order(1000, 16, 1, 0, 2 * b, 24, readers[0].window, position=10,
                               stream_len=40)
        np.testing.assert_array_equal(rest, want)
        if b == 24:
            np.testing.assert_array_equal(rest, ref[5:])


@pytest.mark.parametrize(("stored", "option"), [(12, "virtual_shards"), (40, "window_samples")])
def test_resume_keeps_the_stored_layout_over_the_defaults(data: Path, stored: int,
                                                          option: str) -> None:
    """A state written with V=12 (or a 40-sample window) resumes into readers whose
    defaults differ (V=24 for 48 x 2 ranks, a 4 MiB window): the stored values decide
    the rest of the epoch's order, or samples would repeat, be skipped, or not fit."""
    with ShardedReader(data, batch_size=48, seed=3, **{option: stored}) as r:
        first = read_all(r, steps=3)
        state, v, window = r.state_dict(), r.virtual_shards, r.window
    parts = []
    for rank in range(2):
        with ShardedReader(data, batch_size=24, rank=rank, world_size=2, seed=3) as r2:
            assert (r2.virtual_shards, r2.window) != (v, window)  # the defaults differ
            r2.load_state_dict(state)
            assert (r2.virtual_shards, r2.window) == (v, window)
            parts.append(read_all(r2))
    ref = pt.global_order(1000, 16, 3, 0, 48, v, window)
    np.testing.assert_array_equal(first, ref[:3])
    np.testing.assert_array_equal(np.concatenate(parts, axis=1), ref[3:])


def test_state_counts_received_batches_not_prefetched(data: Path) -> None:
    with ShardedReader(data, batch_size=24, prefetch=8) as r:
        it = iter(r)
        next(it)
        threading.Event().wait(0.2)  # let the thread run ahead
        assert r.state_dict()["position"] == 24 // r.virtual_shards
        assert len(r) == r.steps_per_epoch - 1


def test_bad_state_is_refused(samples_file, data: Path, tmp_path: Path) -> None:
    with ShardedReader(data, batch_size=24) as r:
        state = r.state_dict()
    other = samples_file(tmp_path / "other.h5", 999)
    with ShardedReader(other, batch_size=24) as r, pytest.raises(ReaderError, match="999"):
        r.load_state_dict(state)
    with ShardedReader(data, batch_size=5, world_size=5) as r:
        with pytest.raises(ReaderError, match="world size must divide 24"):
            r.load_state_dict(state)
        with pytest.raises(ReaderError, match="lacks position"):
            r.load_state_dict({k: v for k, v in state.items() if k != "position"})


def test_state_from_another_order_definition_resumes_only_at_an_epoch_end(data: Path) -> None:
    """A mid-epoch position means nothing under another order: refused, naming the versions."""
    with ShardedReader(data, batch_size=24) as r:
        it = iter(r)
        next(it)
        state = r.state_dict()
        assert state["order"] == pt.ORDER_VERSION
        old = {k: v for k, v in state.items() if k != "order"}  # written before version 2
        with pytest.raises(ReaderError, match=f"order version 1.*version {pt.ORDER_VERSION}"):
            r.load_state_dict(old)
        r.load_state_dict({**old, "position": 0})  # an epoch's start is the same everywhere
        assert r.state_dict()["position"] == 0


def test_batches_kept_by_the_consumer_are_never_overwritten(data: Path) -> None:
    """Batches are views into reused window arrays: one still held must not be refilled."""
    with ShardedReader(data, batch_size=24, window_samples=8, prefetch=2) as r:
        kept = [(x, y, x.clone(), y.clone()) for x, y in r]
        r.set_epoch(1)
        again = [(x.clone(), y.clone()) for x, y in r]
    for x, y, x0, y0 in kept:
        assert torch.equal(x, x0) and torch.equal(y, y0)
    assert not all(torch.equal(a[1], b[3]) for a, b in zip(again, kept))


def test_thread_errors_reach_the_consumer_and_threads_stop(data: Path) -> None:
    def boom(x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("transform failed")

    r = ShardedReader(data, batch_size=24, transform=boom)
    with pytest.raises(RuntimeError, match="transform failed"):
        next(iter(r))
    r.close()
    with ShardedReader(data, batch_size=24, prefetch=4) as r:
        for _ in zip(range(3), r):
            pass
    alive = [t for t in threading.enumerate() if t.name.startswith("hpcdp-reader")]
    for t in alive:
        t.join(timeout=5)
    assert not any(t.is_alive() for t in alive)


def _child_labels(reader: ShardedReader, q: mp.Queue) -> None:  # type: ignore[type-arg]
    q.put(read_all(reader))


@pytest.mark.parametrize("method", ["fork", pytest.param("forkserver", marks=pytest.mark.slow),
                                    pytest.param("spawn", marks=pytest.mark.slow)])
def test_reader_in_another_process(data: Path, method: str) -> None:
    r = ShardedReader(data, batch_size=24, seed=3)
    expected = read_all(r)  # the parent has the file open
    r.set_epoch(0)
    pickle.dumps(r)
    ctx = mp.get_context(method)
    q = ctx.Queue()
    p = ctx.Process(target=_child_labels, args=(r, q))
    p.start()
    got = q.get(timeout=60)
    p.join(timeout=30)
    assert p.exitcode == 0
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(read_all(r), expected)  # the parent's handle still works
    r.close()


@pytest.mark.parametrize(("window", "prefetch"), [(3, 0), (7, 2), (40, 1), (100, 0)])
def test_windows_not_aligned_with_steps(samples_file, tmp_path: Path, window: int,
                                        prefetch: int) -> None:
    """Per-stream batch 4 (96 / 24): windows smaller than, or not a multiple of, a step."""
    path = samples_file(tmp_path / "w.h5", 777, chunk=5)
    ref = pt.global_order(777, 5, 2, 1, 96, 24, window)
    with ShardedReader(path, batch_size=48, rank=1, world_size=2, seed=2,
                       window_samples=window, prefetch=prefetch) as r:
        r.set_epoch(1)
        np.testing.assert_array_equal(read_all(r), ref[:, 48:])
    # Resume at a position that is not a multiple of the new per-stream batch (4 -> 5).
    with ShardedReader(path, batch_size=96, seed=2, window_samples=window) as r:
        r.set_epoch(1)
        first = read_all(r, steps=3)
        state = r.state_dict()
    with ShardedReader(path, batch_size=120, seed=2, window_samples=window,
                       prefetch=prefetch) as r:
        r.load_state_dict(state)
        rest = read_all(r)
    np.testing.assert_array_equal(first, ref[:3])
    np.testing.assert_array_equal(
        rest, pt.global_order(777, 5, 2, 1, 120, 24, window, position=12,
                              stream_len=state["stream_length"]))


def test_recycler_reuses_only_released_arrays() -> None:
    from hpcdp.data.read.windows import Recycler

    pool = Recycler()
    shape, dtype = (4, 3), np.dtype(np.uint8)
    a = pool.get(shape, dtype)
    a_id = id(a)
    held = torch.from_numpy(a[1:])  # a consumer keeps a view of it
    del a
    b = pool.get(shape, dtype)
    assert id(b) != a_id  # still held: a new array
    b_id = id(b)
    del b
    assert id(pool.get(shape, dtype)) == b_id  # released: reused
    del held
    assert id(pool.get(shape, dtype)) in (a_id, b_id)


def test_assembler_read_ahead_thread_gives_the_same_batches(data: Path) -> None:
    from hpcdp.data.read.windows import Assembler, Plan, Recycler

    with h5py.File(data, "r") as f:
        plan = Plan(num_samples=1000, block=16, seed=3, epoch=1, stream_len=40, window=11,
                    per_stream=2, streams=range(24), position=6, steps=17)
        got = {}
        for ahead in (False, True):
            asm = Assembler(plan, f["x"], f["y"], (2,), np.dtype(np.float32), 48,
                            (Recycler(), Recycler()), read_ahead=ahead)
            got[ahead] = [y.copy() for _, y in asm]
    assert len(got[True]) == 17
    np.testing.assert_array_equal(np.stack(got[True]), np.stack(got[False]))
    want = pt.global_order(1000, 16, 3, 1, 48, 24, 11, position=6, stream_len=40)
    np.testing.assert_array_equal(np.stack(got[False]), want)
