"""The mapped-file path: the same batches as the HDF5 path, and a fallback where it cannot map."""

from __future__ import annotations

import mmap
from pathlib import Path

import h5py
import numpy as np
import pytest

from hpcdp.data.read import order as pt
from hpcdp.data.read.samples import MMAP_ENV, ShardedReader
from hpcdp.data.read.windows import RowMap, locate_rows


def make_file(path: Path, n: int, shape: tuple[int, ...], chunk: int | None,
              dtype: str = "uint8", **kw: object) -> Path:
    """Random samples (so a misplaced byte shows) with labels 0..n-1, interleaved storage."""
    rng = np.random.default_rng(n)
    x = rng.integers(0, 250, size=(n, *shape)).astype(dtype)
    with h5py.File(path, "w") as f:
        dx = f.create_dataset("x", shape=x.shape, dtype=x.dtype,
                              chunks=(chunk, *shape) if chunk else None, **kw)
        dy = f.create_dataset("y", shape=(n,), dtype=np.int32, chunks=(chunk,) if chunk else None)
        # Write chunk by chunk, labels in between, so chunks do not sit back to back.
        step = chunk or n
        for a in range(0, n, step):
            dx[a : a + step] = x[a : a + step]
            dy[a : a + step] = np.arange(a, min(n, a + step))
    return path


def batches(path: Path, *, mmap: bool, epoch: int = 1, stop_after: int | None = None,
            state: dict | None = None, **kw: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    xs, ys = [], []
    with ShardedReader(path, seed=5, mmap=mmap, **kw) as r:  # type: ignore[arg-type]
        assert r.mapped is mmap
        if state is not None:
            r.load_state_dict(state)
        r.set_epoch(epoch)
        for j, (x, y) in enumerate(r):
            xs.append(x.numpy().copy())
            ys.append(y.numpy().copy())
            if stop_after is not None and j + 1 == stop_after:
                break
    return xs, ys


CASES = {
    # 1000 rows in chunks of 17: the last chunk holds 14 rows (stored at full size).
    "partial last chunk": dict(n=1000, shape=(3, 5, 7), chunk=17),
    "contiguous layout": dict(n=700, shape=(4, 3), chunk=None),
    "float64 scalar samples": dict(n=500, shape=(), chunk=9, dtype="float64"),
    "int16 odd sample size": dict(n=600, shape=(3, 3), chunk=11, dtype="int16"),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize(("batch", "world", "window"), [(24, 1, None), (12, 2, 13)])
def test_mapped_and_hdf5_batches_are_bitwise_identical(tmp_path: Path, case: str, batch: int,
                                                       world: int, window: int | None) -> None:
    path = make_file(tmp_path / "d.h5", **CASES[case])  # type: ignore[arg-type]
    for rank in range(world):
        kw = dict(batch_size=batch, rank=rank, world_size=world, window_samples=window)
        hx, hy = batches(path, mmap=False, **kw)  # type: ignore[arg-type]
        mx, my = batches(path, mmap=True, **kw)  # type: ignore[arg-type]
        assert len(mx) == len(hx) > 0
        for a, b in zip(mx, hx, strict=True):
            assert a.dtype == b.dtype and a.shape == b.shape
            assert a.tobytes() == b.tobytes()
        np.testing.assert_array_equal(np.stack(my), np.stack(hy))
        # Every sample once: the labels name the rows, and the rows hold the file's bytes.
        with h5py.File(path, "r") as f:
            rows = np.stack(my).reshape(-1)
            assert len(set(rows.tolist())) == len(rows)
            want = f["x"][np.sort(rows)]
            got = np.concatenate(mx)[np.argsort(rows)]
            assert got.tobytes() == want.tobytes()


def test_mapped_resume_mid_epoch_matches_hdf5(tmp_path: Path) -> None:
    path = make_file(tmp_path / "d.h5", n=1000, shape=(6,), chunk=17)
    kw = dict(batch_size=48, window_samples=7)
    with ShardedReader(path, seed=5, mmap=True, **kw) as r:  # type: ignore[arg-type]
        r.set_epoch(2)
        for j, _ in enumerate(r):
            if j == 4:
                break
        state = r.state_dict()
    # 1000 // 48 = 20 steps fill 24 streams of 40 (in chunks of 17); 5 steps took 10 of each;
    # resumed with 72 a step, the rest is the global order from there, 3 a stream a step.
    want = pt.global_order(1000, 17, 5, 2, 72, 24, 7, position=10, stream_len=40)
    with h5py.File(path, "r") as f:
        rows = f["x"][:]
    for mm in (True, False):
        xs, ys = batches(path, mmap=mm, epoch=2, state=state, batch_size=72, window_samples=7)
        np.testing.assert_array_equal(np.stack(ys), want)
        assert np.stack(xs).tobytes() == rows[want].tobytes()


def test_compressed_and_filtered_data_fall_back_to_hdf5(tmp_path: Path) -> None:
    gz = make_file(tmp_path / "gz.h5", n=300, shape=(4,), chunk=10, compression="gzip")
    sh = make_file(tmp_path / "sh.h5", n=300, shape=(4,), chunk=10, shuffle=True)
    for path in (gz, sh):
        with h5py.File(path, "r") as f:
            assert locate_rows(f["x"]) is None
        hx, hy = batches(path, mmap=False, batch_size=24)
        with ShardedReader(path, batch_size=24, seed=5, mmap=True) as r:
            assert not r.mapped  # asked for, but not possible: the HDF5 path serves
            r.set_epoch(1)
            got = [(x.numpy().copy(), y.numpy().copy()) for x, y in r]
        assert [x.tobytes() for x, _ in got] == [x.tobytes() for x in hx]


def test_split_unwritten_or_swapped_chunks_fall_back(tmp_path: Path) -> None:
    with h5py.File(tmp_path / "c.h5", "w") as f:
        f.create_dataset("split", data=np.zeros((40, 8), np.uint8), chunks=(10, 4))
        f.create_dataset("sparse", shape=(40, 8), dtype=np.uint8, chunks=(10, 8))
        f["sparse"][0:10] = 1  # three of four chunks never written
        f.create_dataset("swapped", data=np.zeros((40, 2), ">f4"), chunks=(10, 2))
        assert locate_rows(f["swapped"]) is None  # not native: served as stored, via HDF5
        assert locate_rows(f["split"]) is None
        assert locate_rows(f["sparse"]) is None


def test_environment_switch_and_user_block(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = make_file(tmp_path / "d.h5", n=200, shape=(3,), chunk=8)
    monkeypatch.setenv(MMAP_ENV, "0")
    with ShardedReader(path, batch_size=24) as r:
        assert not r.mapped
    monkeypatch.setenv(MMAP_ENV, "1")
    with ShardedReader(path, batch_size=24) as r:
        assert r.mapped
    # A user block shifts every byte of the file: the map must still find the samples,
    # or refuse itself; either way the batches are the HDF5 path's.
    ub = tmp_path / "ub.h5"
    x = np.arange(200 * 3, dtype=np.uint8).reshape(200, 3)
    with h5py.File(ub, "w", userblock_size=512) as f:
        f.create_dataset("x", data=x, chunks=(8, 3))
        f.create_dataset("y", data=np.arange(200))
    hx, _ = batches(ub, mmap=False, batch_size=24)
    with ShardedReader(ub, batch_size=24, seed=5, mmap=True) as r:
        r.set_epoch(1)
        mx = [b.numpy().copy() for b, _ in r]
    assert [a.tobytes() for a in mx] == [a.tobytes() for a in hx]


def test_row_map_reads_rows_and_unmaps(tmp_path: Path) -> None:
    path = make_file(tmp_path / "d.h5", n=100, shape=(5,), chunk=7)
    with h5py.File(path, "r") as f:
        rows = RowMap.open(str(path), f["x"])
        assert rows is not None
        pick = np.array([99, 0, 50, 7, 6])
        got = rows.gather(rows.offsets(pick)).view(np.uint8).reshape(len(pick), 5)
        np.testing.assert_array_equal(got, f["x"][np.sort(pick)][np.argsort(np.argsort(pick))])
        assert rows._cached(0)  # just read: the probe must see the first page cached
        rows.advise([(0, 100)], mmap.MADV_WILLNEED)  # hints only: no error, no change
        rows.advise([(3, 40)], mmap.MADV_DONTNEED)
        again = rows.gather(rows.offsets(pick)).view(np.uint8).reshape(len(pick), 5)
        np.testing.assert_array_equal(again, got)
        rows.close()
        with pytest.raises(AssertionError, match="closed"):
            rows.gather(rows.offsets(pick))


def test_willneed_is_skipped_for_a_warm_window_and_asked_for_a_cold_one(tmp_path: Path) -> None:
    import os
    import time

    path = make_file(tmp_path / "c.h5", n=4000, shape=(3, 32, 32), chunk=100)
    with h5py.File(path, "r") as f:
        rows = RowMap.open(str(path), f["x"])
        assert rows is not None
        runs = [(0, 900), (2000, 2500), (3900, 4000)]
        assert rows._warm(runs)  # just written: in the page cache
        rows.drop()  # unmapped here, so that the kernel may evict the pages
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        if rows._warm(runs):
            pytest.skip("this file system kept the pages after POSIX_FADV_DONTNEED")
        rows.advise(runs, mmap.MADV_WILLNEED)  # cold: every piece is asked for
        deadline = time.monotonic() + 10
        while not rows._warm(runs) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert rows._warm(runs), "MADV_WILLNEED did not bring the cold window in"
        rows.close()


def test_file_truncated_under_the_mapping_dies_with_the_stack_named(tmp_path: Path) -> None:
    """SIGBUS cannot be turned into an exception; the process must at least say where."""
    import signal
    import subprocess
    import sys
    import textwrap

    path = make_file(tmp_path / "t.h5", 4000, (3, 8, 8), chunk=100)
    script = textwrap.dedent(f"""
        import os
        from hpcdp.runtime.crash import report_crashes
        from hpcdp.data.read.samples import ShardedReader
        report_crashes()
        r = ShardedReader({str(path)!r}, batch_size=64, seed=1)
        assert r.mapped
        it = iter(r)
        next(it)  # the labels (one HDF5 chunk) are read by now: only the mapping is left
        os.truncate({str(path)!r}, 4096)
        for _ in it:
            pass
        print("not reached")
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == -signal.SIGBUS, proc.stderr
    assert "not reached" not in proc.stdout
    assert "Bus error" in proc.stderr and "windows.py" in proc.stderr, proc.stderr
