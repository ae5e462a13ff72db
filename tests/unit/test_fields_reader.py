"""Several row-aligned datasets read as one sample: aligned, in the single reader's order."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

from hpcdp.data.read import order as pt
from hpcdp.data.read.multi_field import FieldReader
from hpcdp.data.read.samples import ReaderError

N, CHUNK = 1000, 16
FIELDS = ("dense", "sparse", "label")


def read_rows(reader: FieldReader, steps: int | None = None) -> np.ndarray:
    """The file rows of every batch, checking that the fields of each slot agree."""
    rows = []
    for dense, sparse, label in reader:
        r = sparse[:, 0].numpy().astype(np.int64)
        np.testing.assert_array_equal(dense[:, 0].numpy(), r)
        np.testing.assert_array_equal(dense[:, 1].numpy(), -r)
        np.testing.assert_array_equal(sparse[:, 2].numpy(), 3 * r)
        np.testing.assert_array_equal(label.numpy(), r % 2)
        assert label.dtype.is_floating_point is False and label.shape == (reader.batch_size,)
        rows.append(r)
        if steps is not None and len(rows) == steps:
            break
    return np.stack(rows)


@pytest.mark.parametrize("mmap", [True, False])
def test_fields_come_aligned_in_the_single_readers_order(fields_file, tmp_path: Path,
                                                         mmap: bool) -> None:
    path = fields_file(tmp_path / "c.h5")
    # A window shorter than a stream (1000 // 48 * 48 / 24 = 40 rows), so that it shuffles.
    with FieldReader(path, FIELDS, batch_size=48, seed=5, window_samples=24, mmap=mmap) as r:
        assert r.mapped is mmap
        r.set_epoch(2)
        got = read_rows(r)
    np.testing.assert_array_equal(got, pt.global_order(N, CHUNK, 5, 2, 48, 24, 24))


def test_each_rank_reads_its_slice_of_the_global_batch(fields_file, tmp_path: Path) -> None:
    path = fields_file(tmp_path / "c.h5")
    parts = []
    for rank in range(2):
        with FieldReader(path, FIELDS, batch_size=24, rank=rank, world_size=2, seed=1,
                         window_samples=16) as r:
            parts.append(read_rows(r))
    np.testing.assert_array_equal(np.concatenate(parts, axis=1),
                                  pt.global_order(N, CHUNK, 1, 0, 48, 24, 16))


def test_resume_mid_epoch_continues_exactly(fields_file, tmp_path: Path) -> None:
    path = fields_file(tmp_path / "c.h5")
    whole = read_rows(FieldReader(path, FIELDS, batch_size=48, seed=3))
    first = FieldReader(path, FIELDS, batch_size=48, seed=3)
    head = read_rows(first, steps=7)
    state = first.state_dict()
    first.close()
    resumed = FieldReader(path, FIELDS, batch_size=48, seed=3)
    resumed.load_state_dict(state)
    resumed.set_epoch(state["epoch"])
    assert len(resumed) == len(whole) - 7
    np.testing.assert_array_equal(np.concatenate([head, read_rows(resumed)]), whole)


def test_the_default_window_counts_every_field(fields_file, tmp_path: Path) -> None:
    path = fields_file(tmp_path / "c.h5")
    r = FieldReader(path, FIELDS, batch_size=8)
    assert len({sub.window for sub in r.readers}) == 1
    # 8 + 12 + 1 bytes a row: about 4 MiB of rows, in whole chunks.
    assert r.window == CHUNK * ((4 << 20) // (CHUNK * 21))


def test_fields_chunked_differently_are_refused(fields_file, tmp_path: Path) -> None:
    path = fields_file(tmp_path / "c.h5", chunks=(CHUNK, CHUNK, 2 * CHUNK))
    with pytest.raises(ReaderError, match="field 'label' is chunked by 32 rows but 'dense' by 16"):
        FieldReader(path, FIELDS, batch_size=8)


def test_fields_of_different_lengths_and_missing_fields_are_refused(fields_file,
                                                                    tmp_path: Path) -> None:
    path = fields_file(tmp_path / "c.h5")
    with h5py.File(path, "a") as f:
        f.create_dataset("short", data=np.zeros(N - 1, np.float32), chunks=(CHUNK,))
    with pytest.raises(ReaderError, match="field 'short' has 999 rows but 'dense' has 1000"):
        FieldReader(path, ("dense", "short"), batch_size=8)
    with pytest.raises(ReaderError, match="no data dataset 'nope'"):
        FieldReader(path, ("dense", "nope"), batch_size=8)
    with pytest.raises(ReaderError, match="named twice"):
        FieldReader(path, ("dense", "dense"), batch_size=8)
