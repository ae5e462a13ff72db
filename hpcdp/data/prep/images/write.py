"""Decode a split's files over the ranks and write them as one samples-first HDF5 file.

Each rank decodes a contiguous range of the split's files holding about equal
bytes (`folder.byte_ranges`), in two passes: the first decodes every file of
its range, so that the ranks agree on the undecodable ones and on the training
statistics before any file is created; the second writes. A rank's decoded
share is kept in memory between the passes up to `KEEP_BYTES`, beyond which it
is decoded again. Rows follow the files' output order whatever the number of
ranks (rank r's first row is the count of good files before its range), so 1
and N ranks write the same datasets and attributes.

Per-channel sums and sums of squares are exact integers (`stats`), so the mean
and standard deviation are the same on any number of ranks.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hpcdp import __version__
from hpcdp.data.format import samples
from hpcdp.data.prep.frame import allreduce, create_h5, exscan, mpio_write, replacing
from hpcdp.data.prep.images.decode import MAX_PIXELS, DecodeError, decode
from hpcdp.data.prep.images.folder import Entry, byte_ranges
from hpcdp.data.prep.images.stats import integer_sums

#: A rank keeps its decoded share between the passes up to this many bytes.
KEEP_BYTES = 1 << 30


@dataclass
class Share:
    """One rank's part of one split after the checking pass."""

    split: str
    entries: list[Entry]  # this rank's files, in output order
    good: list[int] = field(default_factory=list)  # positions in `entries` that decoded
    bad: list[str] = field(default_factory=list)  # messages naming the others
    kept: np.ndarray | None = None  # the good ones' arrays, when they fit KEEP_BYTES
    sums: np.ndarray = field(default_factory=lambda: np.zeros(3, np.int64))
    squares: np.ndarray = field(default_factory=lambda: np.zeros(3, np.int64))
    pixels: int = 0  # per channel


def rank_share(split: str, entries: Sequence[Entry], rank: int, size: int) -> list[Entry]:
    lo, hi = byte_ranges([e.nbytes for e in entries], size)[rank]
    return list(entries[lo:hi])


def check_share(split: str, entries: list[Entry], size: int, fit: str,
                max_pixels: int = MAX_PIXELS) -> Share:
    """Decode every file of this rank's share (the first pass)."""
    share = Share(split, entries)
    keep = len(entries) * 3 * size * size <= KEEP_BYTES
    arrays = []
    for i, e in enumerate(entries):
        try:
            arr = decode(e.path, size, fit, max_pixels=max_pixels)
        except DecodeError as exc:
            share.bad.append(str(exc))
            continue
        share.good.append(i)
        sums, squares, pixels = integer_sums(arr[None])
        share.sums += sums
        share.squares += squares
        share.pixels += pixels
        if keep:
            arrays.append(arr)
    if keep:
        share.kept = (np.stack(arrays) if arrays
                      else np.zeros((0, 3, size, size), np.uint8))
    return share


@dataclass(frozen=True)
class SplitFile:
    """What a split's file holds beside its rows (the same on every rank)."""

    name: str
    num_samples: int
    size: int
    attrs: dict[str, Any]


def file_attrs(split: str, num_samples: int, size: int, classes: list[str],
               mean: list[float], std: list[float], params: dict[str, Any],
               bad_skipped: int, seed: int) -> dict[str, Any]:
    schema = {"x": {"shape": [num_samples, 3, size, size], "dtype": "uint8"},
              "y": {"shape": [num_samples], "dtype": "int64"}}
    return {
        "schema": json.dumps(schema),
        "num_samples": num_samples,
        "source": params.get("source", "images"),
        "split": split,
        "seed": seed,
        "source_params": json.dumps(params, sort_keys=True),
        "classes": json.dumps(classes),
        "mean": np.asarray(mean, np.float64),
        "std": np.asarray(std, np.float64),
        "bad_files_skipped": bad_skipped,
        "hpcdp_version": __version__,
    }


def _slabs(share: Share, size: int, fit: str, rows: int,
           max_pixels: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """This rank's good images and labels, `rows` at a time (decoded again if not kept)."""
    good = share.good
    for a in range(0, len(good), rows):
        idx = good[a : a + rows]
        if share.kept is not None:
            x = share.kept[a : a + len(idx)]
        else:
            x = np.stack([decode(share.entries[i].path, size, fit, max_pixels=max_pixels)
                          for i in idx])
        y = np.asarray([share.entries[i].label for i in idx], np.int64)
        yield x, y


def write_split(out_dir: str, share: Share, meta: SplitFile, fit: str, comm: Any,
                max_pixels: int = MAX_PIXELS) -> str:
    """Collective: ``out_dir/NAME.h5`` from every rank's share, via a temporary name."""
    final = os.path.join(out_dir, f"{meta.name}.h5")
    n, s = meta.num_samples, meta.size
    sample_bytes = 3 * s * s
    chunk = samples.chunk_rows(sample_bytes, n)
    slab = samples.slab_rows(chunk, sample_bytes)
    first = exscan(comm, len(share.good))
    rounds = allreduce(comm, -(-len(share.good) // slab), op="max")
    with replacing(final, comm) as tmp, create_h5(tmp, comm) as f:
        x = f.create_dataset("x", shape=(n, 3, s, s), dtype=np.uint8,
                             chunks=(chunk, 3, s, s), fill_time="never")
        y = f.create_dataset("y", shape=(n,), dtype=np.int64,
                             chunks=(samples.label_chunk_rows(chunk, n),), fill_time="never")
        for key, value in meta.attrs.items():
            f.attrs[key] = value
        at = first
        slabs = _slabs(share, s, fit, slab, max_pixels)
        for _ in range(rounds):
            xs, ys = next(slabs, (np.zeros((0, 3, s, s), np.uint8), np.zeros(0, np.int64)))
            if comm.size == 1:
                x[at : at + len(xs)] = xs
                y[at : at + len(ys)] = ys
            else:
                mpio_write(x, at, xs, False)
                mpio_write(y, at, ys, False)
            at += len(xs)
    return final
