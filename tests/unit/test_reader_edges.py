"""The reader at its edges: where batches are built, the mapped-file switch, handing a
reader to another process, iterators that overlap, and refusals in full.

Each test pins down a behaviour that mutation testing (`make mutate`) found
unguarded.
"""

from __future__ import annotations

import os
import pickle
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from hpcdp.data.format.samples import CONTIGUOUS_BLOCK_BYTES
from hpcdp.data.read import order as pt
from hpcdp.data.read import samples as rd
from hpcdp.data.read.samples import ReaderError, ShardedReader


def read_all(reader: ShardedReader, steps: int | None = None) -> np.ndarray:
    """The labels of the pass (its first `steps` batches), checking content follows labels."""
    out = []
    for j, (x, y) in enumerate(reader):
        assert y is not None
        np.testing.assert_array_equal(x[:, 0].numpy(), y.numpy())
        out.append(y.numpy())
        if steps is not None and j + 1 == steps:
            break
    return np.stack(out) if out else np.zeros((0, reader.batch_size), np.int64)


@pytest.fixture
def data(samples_file, tmp_path: Path) -> Path:
    return samples_file(tmp_path / "d.h5", 200)


# ---- the mapped-file switch and the default window ------------------------------------


@pytest.mark.parametrize("value", ["0", "false", "FALSE", " No ", "off", "OFF"])
def test_mmap_switch_turns_off(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(rd.MMAP_ENV, value)
    assert rd.mmap_enabled() is False


@pytest.mark.parametrize("value", [None, "1", "yes", "on", ""])
def test_mmap_switch_stays_on(monkeypatch: pytest.MonkeyPatch, value: str | None) -> None:
    if value is None:
        monkeypatch.delenv(rd.MMAP_ENV, raising=False)
    else:
        monkeypatch.setenv(rd.MMAP_ENV, value)
    assert rd.mmap_enabled() is True


def test_default_window_is_whole_blocks_of_about_window_bytes() -> None:
    assert rd.default_window(1, 1) == rd.WINDOW_BYTES
    assert rd.default_window(16, 8) == 16 * (rd.WINDOW_BYTES // 128)
    # A block of more than half the budget: one block, not two.
    assert rd.default_window(1000, 4096) == 1000
    assert rd.default_window(4, 2 * rd.WINDOW_BYTES) == 4  # larger than the budget: one block


# ---- where batches are built -----------------------------------------------------------


def builder_threads(path: Path, **kw: object) -> set[str]:
    """Names of the threads the transform ran in while reading one epoch."""
    seen: set[str] = set()

    def transform(x: torch.Tensor) -> torch.Tensor:
        seen.add(threading.current_thread().name)
        return x

    with ShardedReader(path, batch_size=8, transform=transform, **kw) as r:
        read_all(r)
    return seen


@pytest.mark.parametrize("mmap", [True, False])
def test_a_transform_runs_in_the_prefetch_thread(data: Path, mmap: bool) -> None:
    assert builder_threads(data, prefetch=2, mmap=mmap) == {"hpcdp-reader"}
    assert builder_threads(data, prefetch=0, mmap=mmap) == {threading.current_thread().name}


def reader_threads_while_reading(path: Path, **kw: object) -> int:
    with ShardedReader(path, batch_size=8, **kw) as r:
        it = iter(r)
        next(it)
        alive = sum(t.name == "hpcdp-reader" for t in threading.enumerate())
        it.close()
    return alive


@pytest.mark.skipif(torch.cuda.is_available(), reason="pinning is a no-op only without CUDA")
def test_the_mapped_file_without_transform_is_read_in_the_consumers_thread(data: Path) -> None:
    assert reader_threads_while_reading(data, prefetch=2, mmap=True) == 0
    assert reader_threads_while_reading(data, prefetch=2, mmap=True, pin_memory=True) == 0
    assert reader_threads_while_reading(data, prefetch=2, mmap=False) == 1
    assert reader_threads_while_reading(data, prefetch=0, mmap=False) == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_pinned_batches_with_cuda(data: Path) -> None:
    for pin in (True, False):
        with ShardedReader(data, batch_size=8, pin_memory=pin) as r:
            x, y = next(iter(r))
            assert x.is_pinned() is pin and y is not None and y.is_pinned() is pin
    with ShardedReader(data, batch_size=8, pin_memory=True, y_name=None) as r:
        x, y = next(iter(r))
        assert x.is_pinned() and y is None


# ---- iterators that overlap ------------------------------------------------------------


def test_a_new_pass_ends_the_old_one_with_a_message(data: Path) -> None:
    with ShardedReader(data, batch_size=8, seed=1) as r:
        old = iter(r)
        next(old)
        new = iter(r)
        with pytest.raises(ReaderError) as err:
            next(old)
        assert str(err.value) == f"{data}: the reader was reset while iterating"
        # The old pass ending leaves the new one alone: it goes on from the same place.
        got = [y.numpy() for _, y in new]
    ref = pt.global_order(200, 16, 1, 0, 8, r.virtual_shards, r.window)
    np.testing.assert_array_equal(np.stack(got), ref[1:])


# ---- resume and epochs -----------------------------------------------------------------


def test_a_loaded_state_resumes_only_its_own_epoch(data: Path) -> None:
    with ShardedReader(data, batch_size=8, seed=2) as r:
        r.set_epoch(0)
        read_all(r, steps=3)
        state = r.state_dict()
    with ShardedReader(data, batch_size=8, seed=2) as r:
        r.load_state_dict(state)
        r.set_epoch(1)  # another epoch than the state's: start it from its beginning
        assert r.epoch == 1 and len(r) == r.steps_per_epoch == 25
        np.testing.assert_array_equal(
            read_all(r), pt.global_order(200, 16, 2, 1, 8, r.virtual_shards, r.window))


def test_a_negative_epoch_is_refused_naming_the_file(data: Path) -> None:
    with ShardedReader(data, batch_size=8) as r, pytest.raises(ReaderError) as err:
        r.set_epoch(-1)
    assert str(err.value) == f"{data}: epoch must be non-negative, got -1"


def test_virtual_shards_the_ranks_cannot_share_are_refused_at_once(data: Path) -> None:
    with pytest.raises(ReaderError) as err:
        ShardedReader(data, batch_size=3, rank=0, world_size=4, virtual_shards=6)
    assert str(err.value) == (f"{data}: 6 virtual shards cannot be split evenly over 4 ranks "
                              "(batch 3 per rank x 4 ranks)")


# ---- handing a reader to another process -----------------------------------------------


def test_a_reader_pickles_mid_epoch_and_keeps_the_mapped_path(data: Path) -> None:
    with ShardedReader(data, batch_size=8, seed=4, mmap=True) as r:
        assert r.mapped
        it = iter(r)
        next(it)  # a pass under way: a prefetcher may be running, windows in use
        copy = pickle.loads(pickle.dumps(r))
        it.close()
    with copy:
        assert copy.mapped  # its own map, made in this process
        assert len(copy) == 24 and copy.state_dict() == r.state_dict()
        np.testing.assert_array_equal(
            read_all(copy), pt.global_order(200, 16, 4, 0, 8, r.virtual_shards, r.window)[1:])


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_opens_the_file_anew(samples_file, tmp_path: Path) -> None:
    """After a fork the child opens the path itself: it reads what the path names now."""
    path = samples_file(tmp_path / "d.h5", 200)
    with ShardedReader(path, batch_size=8, mmap=False) as r:
        first = read_all(r)  # the parent has the file open
        # Replace the file under the same name with one whose labels are shifted by 1000.
        samples_file(tmp_path / "new.h5", 200)
        import h5py

        with h5py.File(tmp_path / "new.h5", "r+") as f:
            f["y"][...] = f["y"][...] + 1000
            f["x"][:, 0] = f["x"][:, 0] + 1000
        os.replace(tmp_path / "new.h5", path)
        r.set_epoch(0)
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: report its labels, exit without cleanup
            try:
                got = read_all(r)
                os.write(write, got.astype(np.int64).tobytes())
            finally:
                os._exit(0)
        os.close(write)
        raw = b""
        while chunk := os.read(read, 1 << 16):
            raw += chunk
        os.close(read)
        os.waitpid(pid, 0)
    child = np.frombuffer(raw, np.int64).reshape(first.shape)
    np.testing.assert_array_equal(child, first + 1000)


# ---- files: defaults, blocks, refusals in full -----------------------------------------


def test_validate_defaults_to_x_and_y_and_one_sample(samples_file, tmp_path: Path) -> None:
    path = samples_file(tmp_path / "one.h5", 1, chunk=None)
    info = rd.validate_dataset(path)
    assert (info.path, info.x_name, info.y_name, info.num_samples) == (str(path), "x", "y", 1)
    assert rd.validate_dataset(path, min_samples=1).num_samples == 1
    assert ShardedReader(path, batch_size=1).info.path == str(path)


def test_exactly_one_global_batch_of_samples_is_enough(samples_file, tmp_path: Path) -> None:
    path = samples_file(tmp_path / "d.h5", 24)
    assert rd.validate_dataset(path, min_samples=24).num_samples == 24
    with pytest.raises(ReaderError) as err:
        rd.validate_dataset(path, min_samples=25)
    assert str(err.value) == f"{path}: 24 samples, fewer than one global batch of 25"


def test_block_rows_follow_the_chunks_or_about_one_mib(tmp_path: Path) -> None:
    import h5py

    path = tmp_path / "b.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("one", data=np.zeros((4, 2)), chunks=(1, 2))
        f.create_dataset("bytes", data=np.zeros(10, np.uint8))  # unchunked, 1-byte samples
        f.create_dataset("big", data=np.zeros((2, 600, 256)))  # unchunked, 1.2 MB samples
        f.create_dataset("y", data=np.zeros(10, np.int64))
    assert rd.validate_dataset(path, "one", None).block == 1
    assert rd.validate_dataset(path, "bytes", None).block == CONTIGUOUS_BLOCK_BYTES
    assert rd.validate_dataset(path, "big", None).block == 1


def test_file_refusals_in_full(tmp_path: Path) -> None:
    import h5py

    with pytest.raises(ReaderError) as err:
        rd.validate_dataset(tmp_path)
    assert str(err.value) == f"{tmp_path}: is a directory, not an HDF5 file"
    empty = tmp_path / "empty.h5"
    h5py.File(empty, "w").close()
    with pytest.raises(ReaderError) as err:
        rd.validate_dataset(empty)
    assert str(err.value) == f"{empty}: no data dataset 'x' (the file holds: nothing)"
    floats = tmp_path / "f.h5"
    with h5py.File(floats, "w") as f:
        f["x"] = np.zeros((4, 2))
        f["y"] = np.zeros(4)
        f["c"] = np.zeros((4, 2), np.complex64)
    with pytest.raises(ReaderError) as err:
        rd.validate_dataset(floats)
    assert str(err.value) == f"{floats}: labels 'y' have dtype float64; integer class labels needed"
    with pytest.raises(ReaderError) as err:
        ShardedReader(floats, batch_size=1, x_name="c", y_name=None)
    assert str(err.value) == f"{floats}: dataset 'c' has dtype complex64; numeric samples needed"


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"path": ""}, "path must be a file path, got ''"),
        ({"path": "a\0b"}, "path must be a file path, got 'a\\x00b'"),
        ({"batch_size": None}, "{path}: batch_size must be an integer, got None"),
    ],
)
def test_argument_refusals_in_full(data: Path, kw: dict, message: str) -> None:
    args = {"path": data, "batch_size": 8, **kw}
    with pytest.raises(ReaderError) as err:
        ShardedReader(args.pop("path"), **args)
    assert str(err.value) == message.format(path=data)


def test_zero_window_and_shards_mean_the_defaults_and_one_is_a_window(data: Path) -> None:
    with ShardedReader(data, batch_size=8, window_samples=0, virtual_shards=0) as r:
        assert r.window == rd.default_window(16, 8) and r.virtual_shards == 8
    with ShardedReader(data, batch_size=8, window_samples=1) as r:  # no shuffle at all
        assert r.window == 1
        got = read_all(r)
    np.testing.assert_array_equal(got, pt.global_order(200, 16, 0, 0, 8, 8, 1))


def test_seed_zero_is_the_default(data: Path) -> None:
    with ShardedReader(data, batch_size=8) as r:
        assert r.seed == 0
        np.testing.assert_array_equal(
            read_all(r), pt.global_order(200, 16, 0, 0, 8, r.virtual_shards, r.window))


def test_a_closed_reader_reads_again(data: Path) -> None:
    for mmap in (True, False):
        with ShardedReader(data, batch_size=8, seed=3, mmap=mmap) as r:
            first = read_all(r)
            r.close()
            r.set_epoch(0)
            np.testing.assert_array_equal(read_all(r), first)
