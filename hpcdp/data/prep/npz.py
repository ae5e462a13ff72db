"""`hpcdp prep npz --files PATH...`: NumPy arrays in many files -> OUT/SPLIT.h5 (x, y).

Each input is one shard: an ``.npz`` archive (as ``numpy.savez`` or ``savez_compressed``
write it) or a folder of ``.npy`` files (such an archive unpacked), holding the samples
(``--x-key``) and, unless ``--y-key ''``, one integer label per sample. The shards follow
one another in the order given, each pattern's matches sorted. The checks read the
headers and the labels; a block reads its own rows alone: memory-mapped where they are
stored as they are, else decompressed up to them, never more than a block at a time.
Nothing is unpickled: an object array is refused unread, naming its file.
"""

from __future__ import annotations

import glob
import math
import os
import zipfile
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from hpcdp.data.prep import arrays, samples
from hpcdp.data.prep.arrays import Source, SourceError

BAD_ZIP = (zipfile.BadZipFile, NotImplementedError, RuntimeError, EOFError, zlib.error)


@dataclass(frozen=True)
class Shards:  # what the split is made from, and so what a resume must share
    files: tuple[str, ...]
    x_key: str
    y_key: str
    split: str


def _options(p: Any) -> None:
    p.add_argument("--files", nargs="+", required=True, metavar="PATH",
                   help="shards: .npz archives or folders of KEY.npy (globs expanded here)")
    p.add_argument("--x-key", default="x", help="the samples' array in each shard")
    p.add_argument("--y-key", default="y", help="the labels' array in each shard ('': none)")
    p.add_argument("--split", default="train", help="output name: SPLIT.h5")


def _shards(args: Any) -> Shards:
    found: list[str] = []
    for pattern in args.files:
        found += [os.path.realpath(p) for p in sorted(glob.glob(pattern)) or [pattern]]
        if not os.path.exists(found[-1]):
            raise SourceError(f"--files {pattern}: no such file or folder")
    return Shards(tuple(found), args.x_key, args.y_key, args.split)


class _Deflated:
    """A compressed .npz member, read a slice of rows at a time (others are mapped)."""

    def __init__(self, shard: str, info: zipfile.ZipInfo) -> None:
        self.shard, self.info, where = shard, info, f"{shard}: array {info.filename[:-4]!r}"
        with zipfile.ZipFile(shard) as zf, zf.open(info) as fh:
            self.shape, fortran, self.dtype, self.offset = arrays.read_npy_header(fh, where)
        arrays.check_npy(where, self.dtype, self.shape, fortran, self.offset, info.file_size)

    def __getitem__(self, rows: slice) -> np.ndarray:
        a, b, _ = rows.indices(self.shape[0])
        row = math.prod(self.shape[1:]) * self.dtype.itemsize
        try:
            with zipfile.ZipFile(self.shard) as zf, zf.open(self.info) as fh:
                fh.seek(self.offset + a * row)  # decompressed up to row a, a bounded read at a time
                got = fh.read((b - a) * row)
        except BAD_ZIP as exc:
            raise SourceError(f"{self.shard}: not a readable .npz archive: {exc}") from None
        return np.frombuffer(got, self.dtype).reshape(-1, *self.shape[1:])


def _array(shard: str, key: str) -> Any:
    """Array `key` of `shard`, its header checked; nothing of its rows read yet."""
    if os.path.isdir(shard):
        return arrays.load_array(os.path.join(shard, f"{key}.npy"), None)
    try:
        if shard.endswith(".npz") and zipfile.is_zipfile(shard):
            with zipfile.ZipFile(shard) as zf:
                info = next((i for i in zf.infolist() if i.filename == f"{key}.npy"), None)
            if info is not None and info.compress_type != zipfile.ZIP_STORED:
                return _Deflated(shard, info)
    except BAD_ZIP as exc:
        raise SourceError(f"{shard}: not a readable .npz archive: {exc}") from None
    return arrays.load_array(shard, key)


class NpzShards(Source):
    """The shards' samples one after another; a slab reads the shards it spans."""

    def __init__(self, made: Shards) -> None:
        samples.check_name("--split", made.split)
        self.x = [_array(f, made.x_key) for f in made.files]
        shape, dtype = self.x[0].shape[1:], self.x[0].dtype
        for f, x in zip(made.files, self.x):
            if not x.shape or x.shape[1:] != shape or x.dtype != dtype or dtype.kind not in "buif":
                raise SourceError(f"{f}: {made.x_key!r} is {x.shape} {x.dtype}; every shard needs "
                                  f"numeric samples of the first's shape {shape} and {dtype}")
        self.y = [_array(f, made.y_key) for f in made.files] if made.y_key else []
        self.starts = np.cumsum([0] + [x.shape[0] for x in self.x]).tolist()
        for f, x, y in zip(made.files, self.x, self.y):  # one shard's labels at a time
            arrays.check_labels(y if isinstance(y, np.ndarray) else y[:],
                                f"{f}: {made.y_key!r}", x.shape[0], f"{f}: {made.x_key!r}")
        if not self.starts[-1]:
            raise SourceError(f"{made.files[0]}: the shards hold no samples")
        super().__init__(made.split, self.starts[-1], tuple(shape), dtype, bool(self.y),
                         {"shards": len(made.files), "x_key": made.x_key, "y_key": made.y_key})

    def slab(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray | None]:
        xs, ys = [], []
        for i, (lo, hi) in enumerate(zip(self.starts, self.starts[1:])):
            if max(start, lo) < min(stop, hi):
                rows = slice(max(start, lo) - lo, min(stop, hi) - lo)
                xs.append(np.asarray(self.x[i][rows]))
                ys += [np.asarray(self.y[i][rows], np.int64)] if self.y else []
        return np.concatenate(xs), np.concatenate(ys) if ys else None


def _files(made: Shards) -> list[str]:  # each archive, or each array of a folder
    return [p for f in made.files for p in ([os.path.join(f, f"{k}.npy") for k in
            (made.x_key, made.y_key) if k] if os.path.isdir(f) else [f])]


RECIPE = samples.recipe(
    "npz", "NumPy .npz archives or folders of .npy shards -> SPLIT.h5 (x, y)", _options,
    _shards, lambda made, seed: [NpzShards(made)], _files)
