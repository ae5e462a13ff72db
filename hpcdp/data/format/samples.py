"""Samples-first files (a data array and optional labels, row-aligned): how their rows are
cut into chunks and write slabs, and the checks a reader relies on.

The chunk arithmetic is pure: every recipe writing fixed-shape samples (arrays, images, clicks,
token windows) relies on, and that a reader's block order assumes: a chunk is the unit of
HDF5 I/O and of shuffling; a rank writes whole chunks; a write round is a slab of whole
chunks, so memory per round is bounded by `SLAB_BYTES` whatever the file size.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import h5py
import numpy as np

#: Target bytes of one HDF5 read when the dataset is not chunked (the block size).
CONTIGUOUS_BLOCK_BYTES = 1 << 20
#: Target chunk size: about 1 MiB of samples (at least one sample).
CHUNK_BYTES = 1 << 20
#: Small datasets are cut into at least this many chunks, so block shuffling has blocks to shuffle.
MIN_CHUNKS = 64
#: Rows generated and written per round, in whole chunks: bounds memory for huge files.
SLAB_BYTES = 8 << 20


def chunk_rows(sample_bytes: int, num_samples: int, target_bytes: int = CHUNK_BYTES) -> int:
    """Rows per chunk: about `target_bytes`, but at least `MIN_CHUNKS` chunks when small."""
    rows = max(1, -(-target_bytes // max(1, sample_bytes)))
    return max(1, min(rows, -(-num_samples // MIN_CHUNKS)))


def slab_rows(chunk: int, sample_bytes: int) -> int:
    """Rows per write round: whole chunks, about `SLAB_BYTES`."""
    return chunk * max(1, SLAB_BYTES // max(1, chunk * sample_bytes))


def label_chunk_rows(chunk: int, num_samples: int) -> int:
    """Label chunks: a whole number of sample chunks, about 256 KiB of int64."""
    return min(num_samples, chunk * max(1, (256 << 10) // (chunk * 8)))


# -- the checks a reader relies on ------------------------------------------------------


class ReaderError(ValueError):
    """Bad input for the reader: the message names the file and the problem."""


@dataclass(frozen=True)
class DatasetInfo:
    """What the reader needs to know about a file, checked before any rank reads."""

    path: str
    x_name: str
    y_name: str | None
    num_samples: int
    sample_shape: tuple[int, ...]
    dtype: np.dtype
    block: int

    @property
    def sample_bytes(self) -> int:
        return int(np.prod(self.sample_shape, dtype=np.int64)) * self.dtype.itemsize


def open_h5(path: str) -> h5py.File:
    """Open read-only with the library's locking default.

    HDF5_USE_FILE_LOCKING=FALSE (set by `hpcdp.runtime.launcher`) turns locking off for
    file systems without it; forcing it here would make any other open of the
    same file in this process fail with "file locking flag values don't match".
    """
    return h5py.File(path, "r")


def _dataset(f: h5py.File, path: str, name: str, role: str) -> h5py.Dataset:
    if name not in f:
        found = ", ".join(sorted(f.keys())) or "nothing"
        raise ReaderError(f"{path}: no {role} dataset {name!r} (the file holds: {found})")
    obj = f[name]
    if not isinstance(obj, h5py.Dataset):
        raise ReaderError(f"{path}: {name!r} is a {type(obj).__name__}, not a dataset")
    return obj


def _block_rows(dset: h5py.Dataset, sample_bytes: int) -> int:
    """The unit of contiguous reads: the chunk rows, or about 1 MiB for unchunked data."""
    if dset.chunks is not None:
        return max(1, int(dset.chunks[0]))
    return max(1, CONTIGUOUS_BLOCK_BYTES // max(1, sample_bytes))


def validate_dataset(
    path: str | os.PathLike[str], x_name: str = "x", y_name: str | None = "y",
    min_samples: int = 1,
) -> DatasetInfo:
    """Check a file for the reader; raise `ReaderError` naming the file and the problem.

    Call this on every rank before any collective, so that bad input ends the job
    with a message everywhere instead of a hang.
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise ReaderError(f"{path}: no such file")
    if os.path.isdir(path):
        raise ReaderError(f"{path}: is a directory, not an HDF5 file")
    try:
        is_hdf5 = h5py.is_hdf5(path)
    except OSError as exc:
        raise ReaderError(f"{path}: cannot be read: {exc}") from exc
    if not is_hdf5:
        raise ReaderError(f"{path}: not an HDF5 file")
    try:
        f = open_h5(path)
    except OSError as exc:
        raise ReaderError(
            f"{path}: cannot be opened as HDF5 (truncated or corrupt?): {exc}"
        ) from exc
    with f:
        x = _dataset(f, path, x_name, "data")
        if x.ndim == 0 or x.shape[0] == 0:
            raise ReaderError(f"{path}: dataset {x_name!r} is empty (shape {x.shape})")
        n = int(x.shape[0])
        if y_name is not None:
            y = _dataset(f, path, y_name, "label")
            if y.ndim != 1:
                raise ReaderError(
                    f"{path}: labels {y_name!r} must be one-dimensional, got shape {y.shape}"
                )
            if y.dtype.kind not in "iub":
                raise ReaderError(
                    f"{path}: labels {y_name!r} have dtype {y.dtype}; integer class labels needed"
                )
            if y.shape[0] != n:
                raise ReaderError(
                    f"{path}: {x_name!r} has {n} samples but {y_name!r} has {y.shape[0]} labels"
                )
        if n < min_samples:
            raise ReaderError(
                f"{path}: {n} samples, fewer than one global batch of {min_samples}"
            )
        sample_shape = tuple(int(d) for d in x.shape[1:])
        dtype = np.dtype(x.dtype)
        info = DatasetInfo(path, x_name, y_name, n, sample_shape, dtype, 1)
        block = _block_rows(x, info.sample_bytes)
        try:  # touch the first and last sample: a file truncated after its header fails here
            x[0:1]
            x[n - 1 : n]
        except (OSError, RuntimeError) as exc:
            raise ReaderError(f"{path}: dataset {x_name!r} cannot be read: {exc}") from exc
    return DatasetInfo(path, x_name, y_name, n, sample_shape, dtype, block)
