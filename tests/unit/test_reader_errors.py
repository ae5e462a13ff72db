"""Each kind of bad input gives a ReaderError that names the file and the problem."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

from hpcdp.data.read.samples import ReaderError, ShardedReader, validate_dataset


def good(path: Path, n: int = 100) -> Path:
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=np.zeros((n, 4), np.float32), chunks=(10, 4))
        f.create_dataset("y", data=np.zeros(n, np.int64))
    return path


def bad_file(tmp_path: Path, kind: str) -> Path:
    path = tmp_path / f"{kind}.h5"
    if kind == "missing":
        return path
    if kind == "not_hdf5":
        path.write_text("just some text\n" * 100)
        return path
    if kind == "truncated":
        good(path, 5000)
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
        return path
    with h5py.File(path, "w") as f:
        if kind == "no_x":
            f.create_dataset("images", data=np.zeros((10, 4)))
        elif kind == "mismatch":
            f.create_dataset("x", data=np.zeros((10, 4)))
            f.create_dataset("y", data=np.zeros(9, np.int64))
        elif kind == "empty":
            f.create_dataset("x", shape=(0, 4), dtype=np.float32)
            f.create_dataset("y", shape=(0,), dtype=np.int64)
        elif kind == "few":
            f.create_dataset("x", data=np.zeros((7, 4)))
            f.create_dataset("y", data=np.zeros(7, np.int64))
        elif kind == "float_labels":
            f.create_dataset("x", data=np.zeros((10, 4)))
            f.create_dataset("y", data=np.zeros(10, np.float32))
        elif kind == "group":
            f.create_group("x")
    return path


CASES = {
    "missing": "no such file",
    "not_hdf5": "not an HDF5 file",
    "truncated": "truncated",
    "no_x": "no data dataset 'x' \\(the file holds: images\\)",
    "mismatch": "'x' has 10 samples but 'y' has 9 labels",
    "empty": "dataset 'x' is empty",
    "few": "7 samples, fewer than one global batch of 8",
    "float_labels": "integer class labels needed",
    "group": "'x' is a Group, not a dataset",
}


@pytest.mark.parametrize("kind", sorted(CASES))
def test_bad_input_names_file_and_problem(tmp_path: Path, kind: str) -> None:
    path = bad_file(tmp_path, kind)
    with pytest.raises(ReaderError, match=CASES[kind]) as err:
        ShardedReader(path, batch_size=4, world_size=2, rank=1)
    assert str(path) in str(err.value)
    with pytest.raises(ReaderError, match=CASES[kind]):
        validate_dataset(path, "x", "y", min_samples=8)


def test_missing_label_name_and_bad_arguments(tmp_path: Path) -> None:
    path = good(tmp_path / "g.h5")
    with pytest.raises(ReaderError, match="no label dataset 'labels'"):
        ShardedReader(path, batch_size=4, y_name="labels")
    with pytest.raises(ReaderError, match="rank 2 is outside a world of 2"):
        ShardedReader(path, batch_size=4, rank=2, world_size=2)
    with pytest.raises(ReaderError, match="not a multiple of 5 virtual shards"):
        ShardedReader(path, batch_size=4, virtual_shards=5)
    info = validate_dataset(path, "x", None)
    assert (info.num_samples, info.sample_shape, info.block) == (100, (4,), 10)
