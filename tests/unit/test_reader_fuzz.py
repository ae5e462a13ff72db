"""ShardedReader's constructor: generated bad arguments and bad files end in a `ReaderError`
naming the argument or the file, never in another exception.
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcdp.data.read.samples import ReaderError, ShardedReader

FUZZ = settings(max_examples=120, deadline=None, derandomize=True, print_blob=True)


@pytest.fixture(scope="module")
def good_file() -> Any:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "good.h5"
        with h5py.File(path, "w") as f:
            f.create_dataset("x", data=np.zeros((64, 3), np.float32), chunks=(8, 3))
            f.create_dataset("y", data=np.zeros(64, np.int64))
        yield path


INT_ARGS = {"batch_size": 1, "rank": 0, "world_size": 1, "seed": 0, "prefetch": 0,
            "window_samples": 0, "virtual_shards": 0}  # the smallest good value of each
WRONG = st.one_of(
    st.floats(allow_nan=True), st.text(max_size=4), st.booleans(), st.lists(st.integers(),
                                                                            max_size=2),
    st.just(object()), st.just(b"4"), st.just(2.0), st.just(math.nan),
)


@FUZZ
@given(name=st.sampled_from(sorted(INT_ARGS)), value=st.one_of(WRONG, st.integers(max_value=-1)))
def test_wrong_integer_arguments_are_named(good_file: Path, name: str, value: Any) -> None:
    with pytest.raises(ReaderError) as err:
        ShardedReader(good_file, **{"batch_size": 4, name: value})
    assert name in str(err.value) or "rank" in str(err.value), (name, value, str(err.value))


@FUZZ
@given(name=st.sampled_from(["x_name", "y_name"]),
       value=st.one_of(st.integers(), st.sampled_from(["", "\0", "x\0", "\udcff", b"x"]),
                       st.lists(st.text(), max_size=1), st.text(max_size=6)))
def test_dataset_names_are_checked(good_file: Path, name: str, value: Any) -> None:
    try:
        ShardedReader(good_file, batch_size=4, **{name: value})
    except ReaderError as e:
        assert name in str(e) or repr(value) in str(e), (name, value, str(e))
    else:
        assert value in ("x", "y")  # only the file's own datasets work


@FUZZ
@given(name=st.sampled_from(["mmap", "transform"]),
       value=st.one_of(st.text(max_size=3), st.integers(2), st.just(0.5), st.just([])))
def test_mmap_and_transform_are_checked(good_file: Path, name: str, value: Any) -> None:
    with pytest.raises(ReaderError, match=name):
        ShardedReader(good_file, batch_size=4, **{name: value})


@FUZZ
@given(path=st.one_of(st.none(), st.integers(), st.just(""), st.just(b"x.h5"),
                      st.text(max_size=8).map(lambda t: "/nonexistent/" + t)))
def test_bad_paths_are_named(path: Any) -> None:
    with pytest.raises(ReaderError, match="path|no such file|not an HDF5|directory"):
        ShardedReader(path, batch_size=1)


def write_bad(path: Path, kind: str, data: bytes) -> None:
    """One kind of bad file: raw bytes, or HDF5 whose datasets are wrong."""
    if kind == "bytes":
        path.write_bytes(data)
        return
    with h5py.File(path, "w") as f:
        n = 16
        if kind == "strings":
            f.create_dataset("x", data=np.array([b"ab"] * n))
        elif kind == "compound":
            f.create_dataset("x", data=np.zeros(n, dtype="i4,f4"))
        elif kind == "vlen":
            f.create_dataset("x", (n,), dtype=h5py.string_dtype())
        elif kind == "complex":
            f.create_dataset("x", data=np.zeros((n, 2), np.complex64))
        elif kind == "scalar":
            f.create_dataset("x", data=1.0)
        elif kind == "no datasets":
            f.create_group("x_group")
        else:
            f.create_dataset("x", data=np.zeros((n, 2), np.float32))
        if kind == "nan labels":
            f.create_dataset("y", data=np.full(n, np.nan))
        elif kind == "2-D labels":
            f.create_dataset("y", data=np.zeros((n, 2), np.int64))
        elif kind == "short labels":
            f.create_dataset("y", data=np.zeros(n - 1, np.int64))
        elif kind not in ("no labels", "no datasets"):
            f.create_dataset("y", data=np.zeros(n, np.int64))


KINDS = ["bytes", "strings", "compound", "vlen", "complex", "scalar", "no datasets",
         "nan labels", "2-D labels", "short labels", "no labels"]


@FUZZ
@given(kind=st.sampled_from(KINDS), data=st.binary(max_size=64),
       cut=st.one_of(st.none(), st.integers(0, 4000)))
def test_bad_files_are_named(kind: str, data: bytes, cut: int | None) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "bad.h5"
        write_bad(path, kind, data)
        if cut is not None:  # truncated anywhere
            path.write_bytes(path.read_bytes()[:cut])
        with pytest.raises(ReaderError) as err:
            ShardedReader(path, batch_size=2)
        assert str(path) in str(err.value)
