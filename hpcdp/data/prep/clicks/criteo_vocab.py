"""The ``--min-count`` vocabulary counted on owner ranks: each rank holds about 1/P of it.

Every distinct categorical value (per field) has one owner rank, found from the
value alone by a range partition of the 32-bit values (`owners`): rank r owns
the r-th P-th of [0, 2**32). Criteo's values are hashes, so the ranges hold
about equal shares. A reader sends each block's value counts to their owners
(`send_counts`, one all-to-all per round of blocks, of the counts a block's
`BlockValues` took when it was parsed); an owner adds them up
(`OwnedCounts`). Since every value of rank r is below every value of rank r+1,
the ids of the kept values in increasing value order (`criteo.Vocabulary`'s
rule) are an owner's positions plus an exclusive prefix sum of the kept counts
(`Shard`), for any number of ranks. Mapping values to ids asks the owners the
same way (`ask_ids`: one all-to-all of questions, one of answers).

Every function with ``comm`` is collective: every rank calls it once per round,
with an empty block when it has none left.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from hpcdp.data.prep.clicks.criteo import CATEGORICAL, EMPTY, EMPTY_ID, RARE_ID

#: Distinct values held on one field before pending counts are merged into the sorted run.
MERGE_AT = 1 << 16


def owners(values: np.ndarray, size: int) -> np.ndarray:
    """The owner of each value in [0, 2**32): rank r owns [r * 2**32 / P, (r+1) * 2**32 / P)."""
    return ((values.astype(np.uint64) * np.uint64(size)) >> np.uint64(32)).astype(np.int64)


def cuts(sorted_values: np.ndarray, size: int) -> np.ndarray:
    """Where increasing `sorted_values` start each owner's run: P + 1 positions."""
    return np.searchsorted(owners(sorted_values, size), np.arange(size + 1))


def exchange(comm: Any, outgoing: list[Any]) -> list[Any]:
    """Collective: item r of `outgoing` goes to rank r; what each rank sent here, by rank."""
    return list(outgoing) if comm.size == 1 else comm.alltoall(outgoing)


@dataclass(frozen=True)
class BlockValues:
    """A block's categorical values as each field's distinct values (increasing) with their
    counts, and each row's position among them: counted once when the block is parsed, they
    are what the owners are sent (`send_counts`) and later asked about (`ask_ids`), and the
    ids of a row are looked up by position, with no second sort of the block."""

    codes: np.ndarray  # (fields, n) int32: the position in the field's distinct values; -1 empty
    distinct: np.ndarray  # uint32: field 0's distinct values, then field 1's, ...
    counts: np.ndarray  # int64: how often each distinct value occurs in the block
    offsets: np.ndarray  # (fields + 1,) int64: field j's at [offsets[j], offsets[j + 1])

    @staticmethod
    def encode(by_field: np.ndarray) -> BlockValues:
        """The (fields, n) raw values, field by field (`criteo.EMPTY` for an empty field),
        encoded."""
        codes = np.full(by_field.shape, -1, np.int32)
        distinct, counts = [], []
        for j, column in enumerate(by_field):
            full = column != EMPTY
            vals, inverse, nums = np.unique(column[full], return_inverse=True,
                                            return_counts=True)
            codes[j, full] = inverse
            distinct.append(vals.astype(np.uint32))
            counts.append(nums.astype(np.int64))
        offsets = np.concatenate([[0], np.cumsum([len(d) for d in distinct])]).astype(np.int64)
        return BlockValues(codes, np.concatenate(distinct) if distinct else np.zeros(0, np.uint32),
                           np.concatenate(counts) if counts else np.zeros(0, np.int64), offsets)

    @property
    def fields(self) -> int:
        return len(self.offsets) - 1

    def field(self, j: int) -> tuple[np.ndarray, np.ndarray]:
        """Field j's distinct values (increasing) and how often each occurs."""
        a, b = self.offsets[j], self.offsets[j + 1]
        return self.distinct[a:b], self.counts[a:b]

    def ids(self, answers: list[np.ndarray]) -> np.ndarray:
        """(n, fields) int32 ids, given each field's ids of its distinct values."""
        ids = np.empty(self.codes.shape, np.int32)
        for j, got in enumerate(answers):
            ids[j] = np.concatenate([[EMPTY_ID], got]).astype(np.int32)[self.codes[j] + 1]
        return ids.T

    def arrays(self) -> dict[str, np.ndarray]:
        return {"codes": self.codes, "distinct": self.distinct, "counts": self.counts,
                "offsets": self.offsets}

    @staticmethod
    def from_arrays(a: Any) -> BlockValues:
        return BlockValues(*(np.asarray(a[k]) for k in ("codes", "distinct", "counts",
                                                          "offsets")))


class OwnedCounts:
    """Per field, the counts of the values this rank owns: one sorted run of distinct values
    and the pieces received since it was last merged. Only whether a value reaches `cap`
    (the ``--min-count``) matters, so counts stop there, in the smallest type that holds it:
    5 bytes a distinct value for a cap below 256. The pieces are merged once they hold a
    quarter of the run's values, into the run by insertion (never re-sorting the run), so
    the memory stays within about twice the run."""

    def __init__(self, cap: int, fields: int = CATEGORICAL) -> None:
        self.cap = cap
        self.dtype = np.min_scalar_type(cap)
        self.wide = np.int64 if cap >= 256 else np.uint32  # holds a sum of capped counts
        self.vals = [np.zeros(0, np.uint32) for _ in range(fields)]
        self.nums = [np.zeros(0, self.dtype) for _ in range(fields)]
        self.pending: list[list[tuple[np.ndarray, np.ndarray]]] = [[] for _ in range(fields)]
        self.held = [0] * fields

    def add(self, j: int, vals: np.ndarray, nums: np.ndarray) -> None:
        if len(vals):
            self.pending[j].append((vals, np.minimum(nums, self.cap).astype(self.dtype)))
            self.held[j] += len(vals)
            if self.held[j] > max(MERGE_AT, len(self.vals[j]) // 4):
                self._merge(j)

    def _merge(self, j: int) -> None:
        """The pending pieces summed per value (one sort of the pieces alone), then added to
        the run: the values already there in place, the new ones inserted in order."""
        if not self.pending[j]:
            return
        vals = np.concatenate([v for v, _ in self.pending[j]])
        nums = np.concatenate([n for _, n in self.pending[j]])
        self.pending[j], self.held[j] = [], 0
        order = np.argsort(vals, kind="stable")
        vals, nums = vals[order], nums[order]
        starts = np.flatnonzero(np.concatenate([[True], vals[1:] != vals[:-1]]))
        vals, total = vals[starts], np.add.reduceat(nums.astype(self.wide), starts)
        run, counts = self.vals[j], self.nums[j]
        at = np.searchsorted(run, vals)
        there = at < len(run)
        there[there] = run[at[there]] == vals[there]
        counts[at[there]] = np.minimum(counts[at[there]] + total[there], self.cap)
        new = ~there
        self.vals[j] = np.insert(run, at[new], vals[new])
        self.nums[j] = np.insert(counts, at[new], np.minimum(total[new], self.cap))

    def counts(self, j: int) -> tuple[np.ndarray, np.ndarray]:
        """Field j's owned values (increasing) and their counts (at most `cap`)."""
        self._merge(j)
        return self.vals[j], self.nums[j]

    def kept(self) -> list[np.ndarray]:
        """Per field, the owned values seen at least `cap` times, increasing."""
        out = []
        for j in range(len(self.vals)):
            vals, nums = self.counts(j)
            out.append(vals[nums >= self.cap])
        return out


def send_counts(comm: Any, block: BlockValues | None, owned: OwnedCounts) -> None:
    """Collective: the counts of this rank's block (None: no block this round) added on
    their owners."""
    outgoing: list[list[tuple[np.ndarray, np.ndarray]]] = [[] for _ in range(comm.size)]
    for j in range(block.fields if block is not None else 0):
        vals, nums = block.field(j)  # type: ignore[union-attr]
        at = cuts(vals, comm.size)
        for r in range(comm.size):
            outgoing[r].append((vals[at[r] : at[r + 1]], nums[at[r] : at[r + 1]]))
    for incoming in exchange(comm, outgoing):
        for j, (vals, nums) in enumerate(incoming):
            owned.add(j, vals, nums)


@dataclass(frozen=True)
class Shard:
    """This rank's part of the vocabulary: per field its kept values (increasing) and the id
    of the first of them; the table sizes of the whole vocabulary."""

    kept: tuple[np.ndarray, ...]
    first_id: tuple[int, ...]
    table_sizes: tuple[int, ...]

    def ids(self, j: int, vals: np.ndarray) -> np.ndarray:
        """Ids of owned values of field j: their kept id, or the rare id."""
        kept = self.kept[j]
        out = np.full(len(vals), RARE_ID, np.int32)
        if len(kept) and len(vals):
            at = np.minimum(np.searchsorted(kept, vals), len(kept) - 1)
            found = kept[at] == vals
            out[found] = self.first_id[j] + at[found]
        return out

    def arrays(self) -> dict[str, np.ndarray]:
        """The shard as named arrays (to save and `from_arrays` again)."""
        out = {f"kept_{j}": k for j, k in enumerate(self.kept)}
        return {**out, "first_id": np.asarray(self.first_id, np.int64),
                "table_sizes": np.asarray(self.table_sizes, np.int64)}

    @staticmethod
    def from_arrays(a: Any) -> Shard:
        fields = len(a["first_id"])
        return Shard(tuple(np.asarray(a[f"kept_{j}"]) for j in range(fields)),
                     tuple(int(x) for x in a["first_id"]),
                     tuple(int(x) for x in a["table_sizes"]))


def make_shard(comm: Any, owned: OwnedCounts) -> Shard:
    """Collective: this rank's shard; ids 2.. in increasing value order over all owners."""
    kept = owned.kept()
    sizes = np.asarray([len(k) for k in kept], np.int64)
    every = np.asarray(comm.allgather(sizes)).reshape(comm.size, -1)
    before = every[: comm.rank].sum(axis=0)
    return Shard(tuple(kept), tuple(int(2 + b) for b in before),
                 tuple(int(2 + t) for t in every.sum(axis=0)))


def ask_ids(comm: Any, block: BlockValues | None, shard: Shard) -> np.ndarray | None:
    """Collective: the (n, 26) int32 ids of this rank's block (None: no block this round),
    each distinct value asked of its owner once."""
    questions: list[list[np.ndarray]] = [[] for _ in range(comm.size)]
    for j in range(block.fields if block is not None else 0):
        distinct = block.field(j)[0]  # type: ignore[union-attr]
        at = cuts(distinct, comm.size)
        for r in range(comm.size):
            questions[r].append(distinct[at[r] : at[r + 1]])
    answers = exchange(comm, [[shard.ids(j, q) for j, q in enumerate(qs)]
                              for qs in exchange(comm, questions)])
    if block is None:
        return None
    return block.ids([np.concatenate([answers[r][j] for r in range(comm.size)])
                      for j in range(block.fields)])
