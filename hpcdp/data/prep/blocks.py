"""Bounded blocks of a preparation's input (pure): byte ranges of files, or ranges of items.

Placeholder with the agreed API until the frame's own module is merged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

#: Input bytes a rank reads, parses or decodes at once (``--block-mib``).
DEFAULT_BLOCK_BYTES = 64 << 20


@dataclass(frozen=True)
class Block:
    """Bytes ``[start, end)`` of `path`: global block `index` in input order."""

    index: int
    path: str
    start: int
    end: int


def byte_range(size: int, rank: int, nranks: int) -> tuple[int, int]:
    """Rank `rank`'s share ``[lo, hi)`` of `size` bytes."""
    return rank * size // nranks, (rank + 1) * size // nranks


def plan_blocks(files: Sequence[tuple[str, int]], block_bytes: int) -> list[Block]:
    """Each file cut into byte ranges of at most `block_bytes`, in input order."""
    out: list[Block] = []
    for path, size in files:
        for start in range(0, max(size, 1), block_bytes):
            out.append(Block(len(out), path, start, min(size, start + block_bytes)))
    return out


def plan_items(n_items: int, items_per_block: int) -> list[range]:
    """Items ``0..n_items`` cut into ranges of at most `items_per_block`."""
    step = max(1, items_per_block)
    return [range(a, min(n_items, a + step)) for a in range(0, n_items, step)]


def rank_blocks(n_blocks: int, rank: int, size: int) -> range:
    """Rank `rank`'s contiguous, even share of `n_blocks` blocks."""
    return range(rank * n_blocks // size, (rank + 1) * n_blocks // size)
