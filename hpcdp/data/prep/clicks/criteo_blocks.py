"""Reading Criteo logs a block at a time: the rows of one block of a file, and gzip files
inflated a block of whole lines at a time (`Inflater`) into chunk files that any rank
can parse.

A block (`hpcdp.data.prep.blocks`) holds the lines that begin in its byte range.
It is parsed in pieces of `PIECE_BYTES`, since parsing holds several times the
bytes it parses; the rows of the pieces together are the block's. A piece is
parsed at C speed (`criteo_fast`) unless it holds a line that is not plainly
good, which `criteo.parse_lines` then names or skips. Line numbers
are only needed to name a bad line, and counting the newlines before a block
costs a read of the file up to it, so that count is made only when a piece has a
bad line, and the piece parsed again to name it (a chunk of a gzip file knows the number
of its first line).
"""

from __future__ import annotations

import gzip
import mmap
import os
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np

from hpcdp.data.prep import bounded, inflate
from hpcdp.data.prep.blocks import line_span, line_start
from hpcdp.data.prep.clicks import criteo as cr
from hpcdp.data.prep.clicks.criteo_fast import fast_rows

#: Bytes of lines parsed at once (the parse holds about 10x this; the rows about 1x).
PIECE_BYTES = 4 << 20
#: Bytes decompressed and written at once.
COPY_BYTES = 4 << 20


def block_pieces(path: str, start: int, end: int, name: str, skip_bad: bool,
                 first_line: int | None = None) -> Iterator[cr.Rows]:
    """The rows of the lines beginning in bytes ``[start, end)`` of plain file `path`, a piece
    of about `PIECE_BYTES` at a time, in line order; a bad line raises `CriteoError` naming
    `name` (the file the user gave) and its line. Lines are numbered from `first_line` at
    byte 0 when given (a chunk of a gzip file), else counted from the file's start."""
    if end <= start:
        return
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size < end:
            raise cr.CriteoError(
                f"{bounded.shown(name)}: {size} bytes now, but at least {end} when the work "
                "was planned: it changed while being read (prepare from files that stay as "
                "they are)")
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
            yield from _pieces(data, start, end, name, skip_bad, first_line or 1)


def _pieces(data: mmap.mmap, start: int, end: int, name: str, skip_bad: bool,
            first_line: int) -> Iterator[cr.Rows]:
    lo, hi = line_span(data, start, end)
    while lo < hi:
        cut = hi if lo + PIECE_BYTES >= hi else min(hi, line_start(data, lo + PIECE_BYTES))
        yield _parse(data, lo, cut, name, skip_bad, first_line)
        lo = cut


def _parse(data: mmap.mmap, lo: int, hi: int, name: str, skip_bad: bool,
           first_line: int) -> cr.Rows:
    """Rows of the lines in ``data[lo:hi]``: at C speed when all are plainly good, else by
    `criteo.parse_lines` (which names the first bad line or skips the bad ones)."""
    if hi - lo <= PIECE_BYTES + cr.MAX_LINE_BYTES + 2:  # else it holds an over-long line
        rows = fast_rows(data[lo:hi])
        if rows is not None:
            return rows
    lines = bounded_lines(data, lo, hi)
    try:
        return cr.parse_lines(lines, name, 1, skip_bad)
    except cr.CriteoError:
        return cr.parse_lines(lines, name, first_line + newlines(data, lo), skip_bad)


def bounded_lines(data: mmap.mmap, lo: int, hi: int) -> list[bytes]:
    """The lines in ``data[lo:hi]`` without their ``\n`` or ``\r\n``, a line longer than
    `criteo.READ_LINE_BYTES` cut there (bad whatever follows): a bad line of any length
    costs its limit, not its length."""
    lines = []
    while lo < hi:
        nl = data.find(b"\n", lo, hi)
        stop = hi if nl < 0 else nl
        line = data[lo : min(stop, lo + cr.READ_LINE_BYTES + 1)]
        lines.append(line[:-1] if stop - lo <= cr.READ_LINE_BYTES and line.endswith(b"\r")
                     else line)
        lo = stop + 1
    return lines


def newlines(data: mmap.mmap, hi: int) -> int:
    """``\n`` bytes in ``data[:hi]``, counted a piece at a time."""
    return sum(data[a : min(hi, a + COPY_BYTES)].count(b"\n") for a in range(0, hi, COPY_BYTES))


class Inflater:
    """A gzipped log inflated a block at a time: each `next_chunk` writes the next block of
    whole lines (those beginning in the next `block_bytes` of the decompressed stream) to a
    file, so that any rank can parse it while this one inflates on. Lines longer than
    `criteo.READ_LINE_BYTES` are cut there (`LineCutter`); a damaged stream, or one
    expanding past `criteo.gzip_budget`, is a `CriteoError` naming the file and the last
    whole line read. A rank holds about one block and one read of `COPY_BYTES`."""

    def __init__(self, path: str, block_bytes: int) -> None:
        self.path, self.block_bytes = path, block_bytes
        self.budget = cr.gzip_budget(path)
        self.cut = LineCutter(cr.READ_LINE_BYTES)
        self.src: Any = None
        self.held = bytearray()  # decompressed lines not yet in a chunk
        self.read_lines = 0  # lines decompressed so far
        self.first_line = 1  # the number of the first line in `held`
        self.counted = 0  # bytes counted against the budget
        self.made: list[tuple[int, int, int]] = []  # each chunk's (first line, bytes,
        # bytes of the gzip file read to make it)
        self.consumed = 0  # bytes of the gzip file read so far
        self.eof = False

    @property
    def chunks(self) -> int:
        """Chunks made so far."""
        return len(self.made)

    @property
    def finished(self) -> bool:
        """Every line read and handed out in a chunk."""
        return self.eof and not self.held

    def next_chunk(self, target: str | None) -> tuple[int, int, int] | None:
        """The next chunk's (number of its first line, bytes, bytes of the gzip file read
        to make it) with its lines written to `target` (under a temporary name renamed into
        place; None: only counted, its part being done already), or None after the last
        chunk."""
        consumed = self.consumed
        while not self.eof and (len(self.held) <= self.block_bytes
                                or self.held.find(b"\n", self.block_bytes - 1) < 0):
            self._read()
        if not self.held:
            return None
        cut = line_start(self.held, self.block_bytes) if len(self.held) > self.block_bytes \
            else len(self.held)
        if target is not None:
            tmp = f"{target}.tmp-{uuid.uuid4().hex[:8]}"
            with open(tmp, "wb") as dst:
                dst.write(memoryview(self.held)[:cut])
            os.replace(tmp, target)
        first = self.first_line
        self.first_line = self.read_lines - self.held.count(b"\n", cut) + 1  # the next's
        del self.held[:cut]
        self.made.append((first, cut, self.consumed - consumed))
        return self.made[-1]

    def _read(self) -> None:
        try:
            if self.src is None:
                self.src = inflate.open_gzip(self.path)
            data = self.src.read(COPY_BYTES)
        except (OSError, *inflate.ERRORS) as exc:
            self.close()
            if isinstance(exc, OSError) and not isinstance(exc, gzip.BadGzipFile) \
                    and exc.errno is not None:
                raise  # the disk, not the file: not bad input
            raise cr.CriteoError(f"{self.path}: cannot be decompressed after line "
                                 f"{self.read_lines}: {exc}") from None
        if not data:
            self.eof, self.consumed = True, os.path.getsize(self.path)
            self.close()
            return
        self.consumed = self.src.fileobj.tell()
        out = self.cut(data)
        ends = out.count(b"\n")  # the cut keeps every line end
        self.counted += max(len(out), ends * cr.MIN_ROW_BYTES)
        if self.counted > self.budget:
            self.close()
            raise cr.gzip_bomb(self.path, self.read_lines + 1)
        self.held += out
        self.read_lines += ends

    def close(self) -> None:
        if self.src is not None:
            self.src.close()
            self.src = None


class LineCutter:
    """Cuts the lines of a stream given in chunks to at most `limit` + 2 bytes each (a
    longer line is bad whatever follows, so its rest is dropped): a decompressed log holding
    one enormous line costs the limit on disk and in memory, not the line. A chunk with no
    such line passes through unchanged, checked at C speed."""

    def __init__(self, limit: int) -> None:
        self.keep = limit + 2
        self.open = 0  # bytes of the unfinished line so far (counted, not all kept)

    def __call__(self, chunk: bytes) -> bytes:
        ends = np.flatnonzero(np.frombuffer(chunk, np.uint8) == 10)
        if not ends.size:
            longest = self.open + len(chunk)
        else:
            longest = max(self.open + int(ends[0]), int(np.diff(ends).max(initial=1)) - 1,
                          len(chunk) - int(ends[-1]) - 1)
        if longest < self.keep:
            self.open = self.open + len(chunk) if not ends.size else len(chunk) - int(ends[-1]) - 1
            return chunk
        parts = chunk.split(b"\n")
        first = parts[0][: max(0, self.keep - self.open)]
        if len(parts) == 1:
            self.open += len(parts[0])
            return first
        self.open = len(parts[-1])
        return b"\n".join([first, *(part[: self.keep] for part in parts[1:])])
