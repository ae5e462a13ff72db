"""A text corpus cut into bounded blocks, and the documents of one block.

The files, sorted, are laid end to end. Files shared by lines (plain JSON Lines,
and text with ``--lines``) are cut into byte ranges of at most the block size
(`hpcdp.data.prep.blocks.plan_blocks`); block ``[start, end)`` holds the lines
whose first byte lies in it, so every line is in exactly one block whatever the
block size. Every other file (one document per text file, gzipped JSON Lines,
Parquet) is one block: its records cannot be reached without reading it from
the start. The blocks are numbered in corpus order, the same on any number of
ranks, so documents numbered block by block are numbered the same everywhere.

A block is read with plain reads of its own bytes (and through the end of its
last line), a window of `WINDOW_BYTES` at a time (`window_lines`), never a map of
the whole file nor the whole block, so a rank's memory is about one window (and
the longest line reaching past it) whatever the file's or the block's size: the
block size sets only how much work a part holds.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from hpcdp.data.prep import blocks as bk
from hpcdp.data.prep import bounded
from hpcdp.data.prep.text import documents as dc
from hpcdp.data.prep.text.writer import TokenPrepError

#: Bytes per read while extending a block to its last line's end, or counting lines.
READ_BYTES = 1 << 20
#: Bytes of a line-shared block read at once: the lines that start in them, and the end of
#: the last one, are all of the block a rank holds.
WINDOW_BYTES = 1 << 21


@dataclass(frozen=True)
class Span:
    """Bytes ``[start, stop)`` of file `file`: one text document or JSON Lines record."""

    file: int
    start: int
    stop: int


def expand_files(patterns: Sequence[str]) -> list[str]:
    """Sorted, distinct regular files matched by `patterns`; a pattern matching none is an
    error that names it."""
    found: set[str] = set()
    for pattern in patterns:
        hits = [p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p)]
        if not hits:
            raise TokenPrepError(f"--files {pattern}: matches no file")
        found.update(os.path.abspath(p) for p in hits)
    return sorted(found)


def line_spans(data: Any, file: int, lo: int, hi: int, base: int = 0) -> list[Span]:
    """Non-empty lines of `data` that start in ``[lo, hi)``, without ``\\n`` or ``\\r\\n``;
    `data` holds the file from byte `base` on, and spans are in file offsets."""
    pos = bk.line_start(data, lo)
    spans = []
    while pos < hi:
        end = data.find(b"\n", pos)
        end = len(data) if end < 0 else end
        stop = end - 1 if end > pos and data[end - 1 : end] == b"\r" else end
        if stop > pos:
            spans.append(Span(file, base + pos, base + stop))
        pos = end + 1
    return spans


def read_lines_of(path: str, start: int, end: int, limit: int) -> tuple[bytes, int]:
    """The bytes of `path` from ``start - 1`` (0 at the start) through the end of the last
    line that starts before `end`, that line cut `limit` + 2 bytes past `end` (a longer line
    is refused whatever follows); and the file offset of the first byte returned."""
    base = max(0, start - 1)
    with open(path, "rb") as fh:
        fh.seek(base)
        data = fh.read(end - base)
        if data.endswith(b"\n"):
            return data, base
        more, left = [data], limit + 2
        while left > 0:
            piece = fh.read(min(READ_BYTES, left))
            nl = piece.find(b"\n")
            if nl >= 0 or not piece:
                more.append(piece[: nl + 1] if nl >= 0 else piece)
                break
            more.append(piece)
            left -= len(piece)
        return b"".join(more), base


def window_lines(path: str, file: int, start: int, end: int, limit: int,
                 window: int = WINDOW_BYTES) -> Iterator[tuple[bytes, Span, int]]:
    """The non-empty lines starting in bytes ``[start, end)`` of `path`, as
    (`read_lines_of`'s bytes, the line's span, their first offset), read `window` bytes
    at a time: the lines of consecutive ranges are those of their union (`line_spans`)."""
    for lo in range(start, end, max(1, window)):
        hi = min(end, lo + max(1, window))
        data, base = read_lines_of(path, lo, hi, limit)
        for span in line_spans(data, file, lo - base, hi - base, base):
            yield data, span, base


def count_lines_before(path: str, offset: int) -> int:
    """Line ends in the first `offset` bytes of `path` (for an error's line number)."""
    count = 0
    with open(path, "rb") as fh:
        while offset > 0:
            piece = fh.read(min(READ_BYTES, offset))
            if not piece:
                break
            count += piece.count(b"\n")
            offset -= len(piece)
    return count


class Corpus:
    """The listed files and their blocks."""

    def __init__(self, paths: list[str], lines: bool, field: str = "text",
                 limits: dc.Limits = dc.DEFAULT_LIMITS) -> None:
        self.paths, self.lines, self.field, self.limits = paths, lines, field, limits
        self.kinds = [dc.kind_of(p) for p in paths]
        self.sizes = [os.path.getsize(p) for p in paths]
        self.total = sum(self.sizes)
        self.index = {p: i for i, p in enumerate(paths)}

    def blocks(self, block_bytes: int) -> list[bk.Block]:
        """Every block of the corpus in order (see the module doc)."""
        whole = {p for p, k in zip(self.paths, self.kinds)
                 if not dc.split_by_lines(k, self.lines)}
        return bk.plan_blocks(list(zip(self.paths, self.sizes)), block_bytes,
                              whole=whole.__contains__)

    def texts(self, block: bk.Block) -> Iterator[str]:
        """The documents of `block` in order: a text span decoded as UTF-8 (bad bytes are an
        error naming the file and offset); the non-empty records of a record file."""
        file = self.index[block.path]
        kind, path = self.kinds[file], block.path
        if kind == dc.JSONL_GZ:
            yield from dc.gzip_texts(path, self.field, self.limits)
        elif kind == dc.PARQUET:
            yield from dc.parquet_texts(path, self.field, self.limits)
        elif not dc.split_by_lines(kind, self.lines):
            with open(path, "rb") as fh:  # a file longer than a record is refused unread
                data = fh.read(self.limits.record_bytes + 1)
            self.limits.check_record(len(data), f"{bounded.shown(path)} (the whole file is "
                                     "one document; --lines makes each line one)")
            yield from _decoded(path, [(data, Span(file, 0, len(data)), 0)], None)
        else:
            lines = window_lines(path, file, block.start, block.end, self.limits.record_bytes)
            if kind == dc.JSONL:
                yield from self._records(path, lines)
            else:
                yield from _decoded(path, lines, self.limits)

    def _records(self, path: str, lines: Iterable[tuple[bytes, Span, int]]) -> Iterator[str]:
        """The non-empty documents of JSON Lines `lines` (`window_lines`) of one block."""
        for data, span, base in lines:
            if span.stop - span.start > self.limits.record_bytes:
                self.limits.check_record(span.stop - span.start, _line_of(path, span.start))
            raw = data[span.start - base : span.stop - base]
            try:
                text = dc.record_text(raw, self.field, bounded.shown(path))
            except TokenPrepError:  # worded again with its line number, counted only now
                dc.record_text(raw, self.field, _line_of(path, span.start))
                raise
            if text:
                yield text


def _line_of(path: str, offset: int) -> str:
    """The file and line number of the line starting at byte `offset`, for a message."""
    return f"{bounded.shown(path)}: line {count_lines_before(path, offset) + 1}"


def _decoded(path: str, lines: Iterable[tuple[bytes, Span, int]],
             limits: dc.Limits | None) -> Iterator[str]:
    """Text spans (`window_lines`) as UTF-8; with `limits` (``--lines``), each line within
    the record limit."""
    for data, span, base in lines:
        if limits is not None:
            limits.check_record(span.stop - span.start,
                                f"{bounded.shown(path)}: byte offset {span.start}")
        raw = data[span.start - base : span.stop - base]
        try:
            yield raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise TokenPrepError(f"{bounded.shown(path)}: invalid UTF-8 at byte offset "
                                 f"{span.start + exc.start}: {exc.reason}") from None
