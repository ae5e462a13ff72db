"""How a preparation's input is cut into blocks and the blocks shared over the ranks (pure).

A block is the unit of reading, of a per-rank part file and of resuming: a byte range of
one input file (lines, records) or a range of input items (image files). The list of
blocks depends on the inputs and the block size only, never on the number of ranks, and
the final file holds the blocks' rows in block order: so 1 and N ranks write the same
file, and a resumed run finds the same blocks as the run it continues. A rank holds one
block of input at a time, so its memory does not grow with the input.

Lines belong to the block that holds their first byte: a reader of block ``[start, end)``
starts at the first line beginning at or after `start` (after the first newline at or after
``start - 1``; at 0 when `start` is 0) and reads through the line that crosses `end` (the
last line beginning before `end`). Every line is then in exactly one block (`line_start`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

#: Bytes of input per block by default (``--block-mib``): large enough that per-block
#: overheads (a part file, a message to rank 0) vanish, small enough for any node.
DEFAULT_BLOCK_BYTES = 64 << 20
#: A small input is still cut into at least this many blocks (when it has as many items),
#: so that up to as many ranks share it.
MIN_BLOCKS = 64


def byte_range(size: int, rank: int, nranks: int) -> tuple[int, int]:
    """Rank `rank`'s share ``[lo, hi)`` of `size` bytes (or items): contiguous, even."""
    return rank * size // nranks, (rank + 1) * size // nranks


def rank_blocks(n_blocks: int, rank: int, size: int) -> range:
    """Rank `rank`'s blocks: a contiguous run, the runs in rank order and within one of
    each other in length, so that rank order is block order."""
    lo, hi = byte_range(n_blocks, rank, size)
    return range(lo, hi)


@dataclass(frozen=True)
class Block:
    """One unit of input: bytes ``[start, end)`` of `path`, or the input items `items`
    (positions in the recipe's list of files) for file-based inputs. `index` is its place
    in the global, rank-independent list of blocks."""

    index: int
    path: str = ""
    start: int = 0
    end: int = 0
    items: range = range(0)

    @property
    def nbytes(self) -> int:
        return self.end - self.start


def plan_blocks(files: Sequence[tuple[str, int]], block_bytes: int,
                whole: Callable[[str], bool] = lambda path: False) -> list[Block]:
    """The blocks of `files` (path, size in bytes), in input order: each file's bytes cut
    every `block_bytes`; a file that cannot be entered midway (``whole(path)``, e.g. gzip)
    is one block; an empty file none."""
    if block_bytes < 1:
        raise ValueError(f"block size must be at least 1 byte, got {block_bytes}")
    blocks: list[Block] = []
    for path, size in files:
        step = size if whole(path) else block_bytes
        for start in range(0, size, max(1, step)):
            blocks.append(Block(len(blocks), path, start, min(size, start + step)))
    return blocks


def plan_items(n_items: int, items_per_block: int) -> list[range]:
    """Items ``0..n_items-1`` cut into consecutive ranges of `items_per_block` (the last
    shorter), for inputs that are lists of files."""
    if items_per_block < 1:
        raise ValueError(f"items per block must be at least 1, got {items_per_block}")
    return [range(a, min(n_items, a + items_per_block))
            for a in range(0, n_items, items_per_block)]


def items_per_block(item_bytes: float, block_bytes: int, n_items: int = 0, unit: int = 1) -> int:
    """Items of about `item_bytes` each per block: a whole number of `unit` items (a chunk,
    a generator's batch) filling about `block_bytes`, but no more than makes `MIN_BLOCKS`
    blocks of `n_items` (when given), so that a small input is still shared by up to that
    many ranks. Depends on no rank count: a resumed run on other ranks finds the same
    blocks."""
    units = max(1, int(block_bytes // max(1.0, item_bytes * unit)))
    if n_items:
        units = min(units, max(1, -(-n_items // (unit * MIN_BLOCKS))))
    return units * unit


def line_start(data: Any, start: int) -> int:
    """Where the first line beginning at or after `start` begins in `data` (bytes, an mmap):
    `start` itself when it is 0 or follows a newline, else just after the next newline
    (``len(data)`` when there is none)."""
    if start <= 0:
        return 0
    nl = data.find(b"\n", start - 1)
    return len(data) if nl < 0 else nl + 1


def line_span(data: Any, start: int, end: int) -> tuple[int, int]:
    """The bytes ``[lo, hi)`` of the whole lines of block ``[start, end)`` of `data`: from
    `line_start(start)` through the end of the line that crosses `end` (its newline
    included)."""
    lo = line_start(data, start)
    hi = max(lo, line_start(data, end))
    return lo, hi
