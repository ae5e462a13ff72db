"""Reading untrusted input in bounded pieces, and naming it safely in messages.

Lines are read a chunk at a time and at most `limit` + 2 bytes of each is kept,
so a file (or a gzip stream that expands a thousandfold) holding one enormous
line costs the limit, not the line: the caller sees a piece longer than its
limit and refuses it (or skips it), naming the file and line. File names come
from the file system and may not be UTF-8; `shown` turns one into text that
every stream can print, so no message fails on a strict stdout after the files
were written.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import BinaryIO

#: Bytes read at a time (bounds what a line costs beyond its limit).
CHUNK_BYTES = 1 << 20
#: A compressed file may expand to its limit times this size at least, however small it is
#: (its headers and footers weigh more, relatively, in a small file).
SMALLEST_COMPRESSED = 64 << 10


def expansion_budget(ratio: int, compressed: int) -> int:
    """Bytes a compressed file of `compressed` bytes may expand to at `ratio` times."""
    return ratio * max(compressed, SMALLEST_COMPRESSED)


def shown(name: str | bytes) -> str:
    """`name` as printable UTF-8 text: bytes that are not UTF-8 (and lone surrogates) as
    backslash escapes, as ``ls -b`` would show them."""
    raw = os.fsencode(name) if isinstance(name, str) else name
    return raw.decode("utf-8", "backslashreplace")


def lines(fh: BinaryIO, limit: int, chunk: int = CHUNK_BYTES) -> Iterator[bytes]:
    """The lines of binary stream `fh` without their ``\\n``: each whole when at most
    `limit` + 1 bytes, else its first `limit` + 2 bytes (longer than the limit whatever the
    line end), the rest skipped unread into memory. Read `chunk` bytes at a time."""
    pending: list[bytes] = []  # the start of the line not yet ended
    size, long = 0, False  # bytes pending; whether this line was already given (cut)
    while piece := fh.read(chunk):
        parts = piece.split(b"\n")
        if len(parts) > 1:
            if not long:
                yield b"".join([*pending, parts[0]])[: limit + 2]
            pending, size, long = [], 0, False
            for part in parts[1:-1]:
                yield part[: limit + 2]
        if long:
            continue
        pending.append(parts[-1])
        size += len(parts[-1])
        if size > limit + 1:
            yield b"".join(pending)[: limit + 2]
            pending, size, long = [], 0, True
    if size and not long:
        yield b"".join(pending)
