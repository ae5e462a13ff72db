"""Reading Criteo logs a block at a time: the rows of one planned block, and gzip files
decompressed once into the work folder so that they can be cut into blocks too.

A block (`hpcdp.data.prep.blocks`) holds the lines that begin in its byte range.
It is parsed in pieces of `PIECE_BYTES`, since parsing holds several times the
bytes it parses; the rows of the pieces together are the block's. A piece is
parsed at C speed (`criteo_fast`) unless it holds a line that is not plainly
good, which `criteo.parse_lines` then names or skips. Line numbers
are only needed to name a bad line, and counting the newlines before a block
costs a read of the file up to it, so that count is made only when a piece has a
bad line, and the piece parsed again to name it.
"""

from __future__ import annotations

import gzip
import mmap
import os
import uuid
import zlib
from collections.abc import Iterator

from hpcdp.data.prep.blocks import line_span, line_start
from hpcdp.data.prep.clicks import criteo as cr
from hpcdp.data.prep.clicks.criteo_fast import fast_rows

#: Bytes of lines parsed at once (the parse holds about 10x this; the rows about 1x).
PIECE_BYTES = 4 << 20
#: Bytes decompressed and written at once.
COPY_BYTES = 4 << 20


def read_block(path: str, start: int, end: int, name: str, skip_bad: bool) -> cr.Rows:
    """The rows of the lines beginning in bytes ``[start, end)`` of plain file `path`; a bad
    line raises `CriteoError` naming `name` (the file the user gave) and its line."""
    return cr.Rows.concat(list(block_pieces(path, start, end, name, skip_bad)))


def block_pieces(path: str, start: int, end: int, name: str, skip_bad: bool
                 ) -> Iterator[cr.Rows]:
    """`read_block`'s rows a piece of about `PIECE_BYTES` at a time, in line order."""
    if end <= start:
        return
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
        lo, hi = line_span(data, start, end)
        while lo < hi:
            cut = hi if lo + PIECE_BYTES >= hi else min(hi, line_start(data, lo + PIECE_BYTES))
            yield _parse(data, lo, cut, name, skip_bad)
            lo = cut


def _parse(data: mmap.mmap, lo: int, hi: int, name: str, skip_bad: bool) -> cr.Rows:
    """Rows of the lines in ``data[lo:hi]``: at C speed when all are plainly good, else by
    `criteo.parse_lines` (which names the first bad line or skips the bad ones)."""
    rows = fast_rows(data[lo:hi])
    if rows is not None:
        return rows
    lines = data[lo:hi].split(b"\n")
    if lines and not lines[-1]:
        lines.pop()  # the empty piece after the last line end
    lines = [x[:-1] if x.endswith(b"\r") else x for x in lines]
    try:
        return cr.parse_lines(lines, name, 1, skip_bad)
    except cr.CriteoError:
        return cr.parse_lines(lines, name, 1 + newlines(data, lo), skip_bad)


def newlines(data: mmap.mmap, hi: int) -> int:
    """``\n`` bytes in ``data[:hi]``, counted a piece at a time."""
    return sum(data[a : min(hi, a + COPY_BYTES)].count(b"\n") for a in range(0, hi, COPY_BYTES))


def gunzip(path: str, target: str) -> None:
    """Gzipped `path` decompressed to `target` (written under a temporary name and renamed,
    so it is there whole or not at all); a damaged stream is a `CriteoError` naming the file
    and the last whole line read."""
    tmp = f"{target}.tmp-{uuid.uuid4().hex[:8]}"
    lines = 0
    try:
        with gzip.open(path, "rb") as src, open(tmp, "wb") as dst:
            while chunk := src.read(COPY_BYTES):
                dst.write(chunk)
                lines += chunk.count(b"\n")
    except (OSError, EOFError, zlib.error) as exc:
        if os.path.exists(tmp):
            os.remove(tmp)
        if isinstance(exc, OSError) and not isinstance(exc, gzip.BadGzipFile) \
                and exc.errno is not None:
            raise  # the disk, not the file: not bad input
        raise cr.CriteoError(f"{path}: cannot be decompressed after line {lines}: {exc}"
                             ) from None
    os.replace(tmp, target)
