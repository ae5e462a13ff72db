"""Who does what in each round of reading one split of Criteo logs (pure: no I/O, no MPI).

A plain file is cut into blocks before the first round. A gzip file cannot be entered
midway, so one rank inflates it (the g-th gzip file of the split: rank g % P), one block
of whole lines at a time, into a chunk file that then joins the queue of blocks any rank
may parse. In every round each rank does one thing. A rank with a gzip file to inflate
inflates its next blocks (as many as fit in the time of a round), unless the queue holds
enough blocks for every rank this round and for the others the next: then it parses, so
the queue cannot grow without bound. Every other rank parses the next queued block. So
one gzip file on P ranks keeps one rank inflating and P - 1 parsing what it hands them,
and 24 day files on 2,048 ranks keep 24 inflating and the rest parsing, the rate then
set by inflating (docs/data-criteo.md).

Every rank holds the same `Schedule` and applies the same reports of each round (after
the round's allgather), so every rank computes the same plan. A block is known by its
key: its file's position in the split times `STRIDE`, plus its place in the file; keys in
increasing order are the rows' order in the output, whatever the rounds were.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

#: Blocks a file may have (a key's room for the block within its file).
STRIDE = 1 << 40
INFLATE, PARSE = "inflate", "parse"


def key(position: int, block: int) -> int:
    """The key of block `block` of the split's file at `position`."""
    if not 0 <= block < STRIDE:
        raise ValueError(f"block {block} of file {position}: a file has at most {STRIDE}")
    return position * STRIDE + block


def position(block_key: int) -> int:
    """The position in the split of the file that holds block `block_key`."""
    return block_key // STRIDE


def inflater(gzip_index: int, size: int) -> int:
    """The rank that inflates the `gzip_index`-th gzip file of a split on `size` ranks."""
    return gzip_index % size


@dataclass
class Schedule:
    """The blocks waiting to be parsed and the gzip files still being inflated."""

    size: int  # ranks
    queue: deque[int] = field(default_factory=deque)  # keys, in the order they became known
    inflating: dict[int, int] = field(default_factory=dict)  # file position -> its rank

    @staticmethod
    def start(size: int, blocks: Iterable[int], gzip_positions: Sequence[int]) -> Schedule:
        """`blocks` known at the start (plain files, gzip files inflated before), and the
        positions of the gzip files left to inflate (in split order)."""
        return Schedule(size, deque(sorted(blocks)),
                        {p: inflater(g, size) for g, p in enumerate(gzip_positions)})

    def finished(self) -> bool:
        return not self.queue and not self.inflating

    def plan(self) -> dict[int, tuple[str, int]]:
        """This round's work: rank -> (INFLATE, file position) or (PARSE, block key); a rank
        not named has nothing to do. Parsed blocks leave the queue."""
        work: dict[int, tuple[str, int]] = {}
        ranks = set(self.inflating.values())
        if len(self.queue) < 2 * self.size - len(ranks):  # else all parse, and still
            for pos, rank in sorted(self.inflating.items()):  # the rest can next round
                work.setdefault(rank, (INFLATE, pos))  # a rank's files one after another
        for rank in range(self.size):
            if rank not in work and self.queue:
                work[rank] = (PARSE, self.queue.popleft())
        return work

    def add(self, keys: Iterable[int]) -> None:
        """Blocks a rank inflated this round join the queue."""
        self.queue.extend(keys)

    def done_inflating(self, pos: int) -> None:
        self.inflating.pop(pos, None)

    def stop_after(self, first_bad: int) -> None:
        """A bad line (or stream) in block `first_bad`: nothing after it is read any more,
        but what comes before it still is, since it may hold an earlier bad line."""
        self.queue = deque(k for k in self.queue if k < first_bad)
        self.inflating = {p: r for p, r in self.inflating.items() if p < position(first_bad)}
