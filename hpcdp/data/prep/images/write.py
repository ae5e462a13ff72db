"""Decode a split's images in bounded blocks into parts, and what a split's file says of them.

A split's files (in output order) are cut into blocks of about ``--block-mib`` of
decoded pixels (at least `blocks.MIN_BLOCKS` blocks when there are as many files, so a
small folder is still shared by the ranks); each rank takes a contiguous, even share of
the blocks (`hpcdp.data.prep.blocks`). Each image is decoded once: a block's good
images become a part (``x`` uint8 ``(n, 3, S, S)``, ``y`` int64), and beside it the
block's undecodable files and its exact per-channel integer sums (`stats`). The ranks
agree on the bad files, the class counts and the statistics from those small
summaries before any file is created; then the frame copies the parts to their rows,
in block order, so 1 and N ranks write the same datasets and attributes.
A rank holds one block of images at a time; a part already saved (``--resume``) is
kept, not decoded again.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import IO, Any

import numpy as np

from hpcdp.data.format.image_decode import MAX_PIXELS, DecodeError, decode
from hpcdp.data.prep.images.shards import Member
from hpcdp.data.prep.images.stats import integer_sums
from hpcdp.data.prep.merge import root_attrs


def source_of(entry: Any) -> str | IO[bytes]:
    """What `decode` reads: a file's path, or a shard member's bytes."""
    return entry.read() if isinstance(entry, Member) else entry.path


def stats_name(split: str) -> str:
    """The parts holding each block's bad files and sums, beside the images' parts."""
    return f"{split}.stats"


def decode_block(entries: Sequence[Any], size: int, fit: str, max_pixels: int = MAX_PIXELS
                 ) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """The good images and labels of one block, and messages naming the bad files."""
    x = np.empty((len(entries), 3, size, size), np.uint8)  # filled in place: one copy
    ys, bad = [], []
    for e in entries:
        try:
            x[len(ys)] = decode(source_of(e), size, fit, name=e.path, max_pixels=max_pixels)
            ys.append(e.label)
        except DecodeError as exc:
            bad.append(str(exc))
    return x[: len(ys)], np.asarray(ys, np.int64), bad


def decode_blocks(split: str, entries: Sequence[Any], blocks: Sequence[range], mine: range,
                  size: int, fit: str, parts: Any, progress: Any,
                  max_pixels: int = MAX_PIXELS) -> str | None:
    """Decode this rank's blocks of `split` into parts; an error reading a file, or None."""
    for b in mine:
        if not parts.done(split, b):
            try:
                x, y, bad = decode_block([entries[i] for i in blocks[b]], size, fit,
                                         max_pixels)
            except OSError as exc:
                return f"cannot read an image: {exc}"
            sums, squares, pixels = integer_sums(x)
            parts.save(stats_name(split), b, sums=sums, squares=squares,
                       pixels=np.array([pixels], np.int64), labels=np.bincount(y),
                       bad=np.array(bad, dtype=str))
            parts.save(split, b, x=x, y=y)
            progress.advance(len(blocks[b]))
        else:
            progress.advance(len(blocks[b]), resumed=True)
    return None


@dataclass
class Summary:
    """A split's blocks summed over every rank (the same on every rank)."""

    bad: list[str]
    count: int
    per_class: np.ndarray
    sums: np.ndarray
    squares: np.ndarray
    pixels: int


def summarize(split: str, parts: Any, mine: range, classes: int, comm: Any) -> Summary:
    """Collective: the bad files (in file order), the good count, the class counts and
    the exact sums of `split`, from the summaries of every rank's blocks."""
    local = []
    for b in mine:
        s = parts.load(stats_name(split), b)
        local.append((b, [str(m) for m in s["bad"]], np.asarray(s["labels"]),
                      np.asarray(s["sums"]), np.asarray(s["squares"]), int(s["pixels"][0])))
    blocks = sorted((got for share in comm.allgather(local) for got in share),
                    key=lambda item: item[0])
    out = Summary([], 0, np.zeros(classes, np.int64), np.zeros(3, np.int64),
                  np.zeros(3, np.int64), 0)
    for _, bad, labels, sums, squares, pixels in blocks:
        out.bad += bad
        out.count += int(labels.sum())
        out.per_class[: len(labels)] += labels
        out.sums += sums
        out.squares += squares
        out.pixels += pixels
    return out


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
    return root_attrs(schema, num_samples, params.get("source", "images"), split, params, seed,
                      {"classes": json.dumps(classes), "mean": np.asarray(mean, np.float64),
                       "std": np.asarray(std, np.float64), "bad_files_skipped": bad_skipped})
