"""Criteo click logs: parsing lines, the feature rules, the limits on what is read.

A line holds 40 tab-separated fields: the label (0 or 1), 13 integer counts
(I1..I13) and 26 categorical values (C1..C26), each 8 hexadecimal digits (at
most 8 are accepted, any case); any field but the label may be empty. The
rules that turn a row into model inputs:

- dense feature j = log(1 + max(count, 0)): an empty count is 0, and a
  negative one (the logs hold a few, e.g. -1 in I2) counts as 0 too;
- categorical ids, per field, either hashed (`hash_ids`: id 0 for an empty
  value, 1 + a stable 64-bit mix of (field, value) modulo N - 1 otherwise, for
  ``--buckets N`` rows a table) or from a vocabulary (`Vocabulary`: id 0 for an
  empty value, 1 for every value seen fewer than ``--min-count`` times in the
  training files or not at all, 2.. for the others in increasing value order).

A line longer than `MAX_LINE_BYTES` (the longest a valid row can be) is a bad
line like any other, but at most `READ_LINE_BYTES` of it are read into memory
and the error is worded from a bounded prefix, so one enormous line costs
neither memory nor time. A gzipped log may expand to at most `GZIP_EXPANSION`
times its size, and a file that is shorter when read than when the ranks
shared the files out is an error naming it.

Nothing here depends on which process reads which rows, so any number of ranks
give the same ids. `parse_lines` is pure; `criteo_blocks` reads the lines of a block
of a file (gzip files inflated a block at a time, with `gzip_budget` as their limit).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hpcdp.data.prep import bounded

DENSE = 13
CATEGORICAL = 26
FIELDS = 1 + DENSE + CATEGORICAL
DENSE_NAMES = tuple(f"I{j}" for j in range(1, DENSE + 1))
CATEGORICAL_NAMES = tuple(f"C{j}" for j in range(1, CATEGORICAL + 1))
#: The raw value of an empty categorical field (hex values are never negative).
EMPTY = -1
EMPTY_ID, RARE_ID = 0, 1
HEX_DIGITS = b"0123456789abcdefABCDEF"
#: The longest valid line: the label, 13 counts of a sign and 18 digits, 26 values of 8
#: hexadecimal digits, each after a tab.
MAX_LINE_BYTES = 1 + DENSE * (1 + 19) + CATEGORICAL * (1 + 8)
#: Bytes of a longer line kept to report it (the rest is never copied).
READ_LINE_BYTES = 4096
#: The most a gzipped log may expand, times its size (at least 64 KiB), each line counted as
#: at least the shortest row (its label, 39 tabs and the line end): a decompression bomb of
#: blank lines is refused after seconds instead of read for minutes.
GZIP_EXPANSION = 100
MIN_ROW_BYTES = FIELDS + 1


class CriteoError(ValueError):
    """A bad row or option: the message names the file and line (or the option)."""


@dataclass
class Rows:
    """Parsed rows: labels, raw counts (empty as 0), raw categorical values (empty as -1)."""

    label: np.ndarray  # (n,) uint8
    counts: np.ndarray  # (n, 13) int64
    values: np.ndarray  # (n, 26) int64
    skipped: int = 0  # bad lines left out (--skip-bad)

    @staticmethod
    def concat(parts: Sequence[Rows]) -> Rows:
        if not parts:
            return Rows(np.zeros(0, np.uint8), np.zeros((0, DENSE), np.int64),
                        np.zeros((0, CATEGORICAL), np.int64))
        return Rows(np.concatenate([p.label for p in parts]),
                    np.concatenate([p.counts for p in parts]),
                    np.concatenate([p.values for p in parts]),
                    sum(p.skipped for p in parts))


# -- one line -------------------------------------------------------------------------


def parse_line(line: bytes) -> tuple[int, list[int], list[int]]:
    """(label, 13 counts, 26 values) of one line without its end; `CriteoError` saying what
    is wrong (the caller adds the file and line)."""
    if len(line) > MAX_LINE_BYTES:
        size = f"over {READ_LINE_BYTES}" if len(line) > READ_LINE_BYTES else str(len(line))
        raise CriteoError(f"the line is {size} bytes; a row has at most {MAX_LINE_BYTES} "
                          f"(it starts {_show(line)})")
    parts = line.split(b"\t")
    if len(parts) != FIELDS:
        raise CriteoError(f"{len(parts)} tab-separated fields, expected {FIELDS} (label, "
                          f"{DENSE} counts, {CATEGORICAL} categorical)")
    if parts[0] not in (b"0", b"1"):
        raise CriteoError(f"label {_show(parts[0])} is not 0 or 1")
    counts = [_count(parts[1 + j], j) for j in range(DENSE)]
    values = [_hex(parts[1 + DENSE + j], j) for j in range(CATEGORICAL)]
    return int(parts[0]), counts, values


def _count(field: bytes, j: int) -> int:
    if not field:
        return 0
    digits = field[1:] if field[:1] == b"-" else field
    if not digits.isdigit() or len(digits) > 18:
        raise CriteoError(f"count {DENSE_NAMES[j]} = {_show(field)} is not an integer"
                          + (" of at most 18 digits" if digits.isdigit() else ""))
    return int(field)


def _hex(field: bytes, j: int) -> int:
    if not field:
        return EMPTY
    if len(field) > 8 or field.translate(None, HEX_DIGITS):
        raise CriteoError(f"categorical {CATEGORICAL_NAMES[j]} = {_show(field)} is not "
                          "hexadecimal (at most 8 digits)")
    return int(field, 16)


def _show(field: bytes) -> str:
    text = field[:24].decode("utf-8", "replace")
    return repr(text + ("..." if len(field) > 24 else ""))


#: A line `parse_line` accepts, as one pattern: checked per line in C, then the fields of all
#: good lines converted at once (`parse_lines`); `parse_line` says what is wrong with the rest.
LINE = re.compile(rb"[01](?:\t(?:-?[0-9]{1,18})?){%d}(?:\t[0-9a-fA-F]{0,8}){%d}"
                  % (DENSE, CATEGORICAL))
#: The value of each hexadecimal digit by its byte (0 for the padding byte).
NIBBLE = np.zeros(256, np.int64)
for _digit in b"0123456789abcdef":
    NIBBLE[_digit] = NIBBLE[bytes([_digit]).upper()[0]] = int(chr(_digit), 16)


def parse_lines(lines: Sequence[bytes], name: str, first_line: int = 1,
                skip_bad: bool = False) -> Rows:
    """Rows of `lines`; a bad line raises `CriteoError` naming ``name: line N`` (line
    numbers from `first_line`), or with `skip_bad` is left out and counted. Blank lines
    are skipped."""
    good: list[bytes] = []
    skipped = 0
    for i, line in enumerate(lines):
        if LINE.fullmatch(line):
            good.append(line)
        elif line:
            if not skip_bad:
                raise CriteoError(f"{bounded.shown(name)}: line {first_line + i}: "
                                  f"{_problem(line)}")
            skipped += 1
    rows = convert(good)
    rows.skipped = skipped
    return rows


def _problem(line: bytes) -> str:
    try:
        parse_line(line)
    except CriteoError as exc:
        return str(exc)
    raise AssertionError(f"LINE refuses a line parse_line takes: {line!r}")  # a bug here


def convert(lines: Sequence[bytes]) -> Rows:
    """Rows of lines that `LINE` matches, all fields converted together."""
    n = len(lines)
    if not n:
        return Rows.concat([])
    fields = np.array(b"\t".join(lines).split(b"\t"), dtype="S19").reshape(n, FIELDS)
    counts = fields[:, 1 : 1 + DENSE].copy()
    counts[counts == b""] = b"0"
    digits = np.ascontiguousarray(fields[:, 1 + DENSE :], dtype="S8")
    chars = digits.view(np.uint8).reshape(n, CATEGORICAL, 8)
    length = (chars != 0).sum(axis=2, keepdims=True)
    place = np.arange(8)
    shift = np.where(place < length, 4 * (length - 1 - place), 0)
    values = (np.where(place < length, NIBBLE[chars], 0) << shift).sum(axis=2)
    values[length[..., 0] == 0] = EMPTY
    return Rows((fields[:, 0] == b"1").astype(np.uint8), counts.astype(np.int64), values)


# -- the rules ------------------------------------------------------------------------


def dense_features(counts: np.ndarray) -> np.ndarray:
    """log(1 + max(count, 0)) as float32 (empty counts were read as 0)."""
    return np.log1p(np.maximum(counts, 0).astype(np.float64)).astype(np.float32)


def hash_ids(ids: np.ndarray, salt: int | Sequence[int], size: int) -> np.ndarray:
    """A fixed pseudo-random map of ids into [0, size) (splitmix64 finaliser); a sequence of
    salts, one for each column of `ids`, hashes every column at once."""
    offsets = [(int(s) * 0x9E3779B97F4A7C15) % 2**64 for s in np.atleast_1d(salt)]
    z = ids.astype(np.uint64) + np.asarray(offsets, np.uint64)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z = z ^ (z >> np.uint64(31))
    return (z % np.uint64(size)).astype(np.int64)


def hashed_ids(values: np.ndarray, buckets: int) -> np.ndarray:
    """(n, 26) int32 ids: 0 for an empty value, else 1 + hash(field, value) mod (buckets - 1)."""
    hashed = hash_ids(values, range(1, values.shape[1] + 1), buckets - 1)  # salt: field j
    return np.where(values == EMPTY, 0, 1 + hashed).astype(np.int32)


def value_counts(values: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per field: (distinct non-empty values, increasing; how often each occurs)."""
    out = []
    for j in range(values.shape[1]):
        column = values[:, j]
        out.append(np.unique(column[column != EMPTY], return_counts=True))
    return out


def merge_counts(parts: Sequence[list[tuple[np.ndarray, np.ndarray]]]
                 ) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per field, the value counts of several readers summed (the same in any order)."""
    merged = []
    for j in range(len(parts[0])):
        vals = np.concatenate([p[j][0] for p in parts])
        nums = np.concatenate([p[j][1] for p in parts])
        distinct, inverse = np.unique(vals, return_inverse=True)
        merged.append((distinct, np.bincount(inverse, weights=nums,
                                             minlength=len(distinct)).astype(np.int64)))
    return merged


@dataclass(frozen=True)
class Vocabulary:
    """Per field, the kept values (seen at least `min_count` times), increasing."""

    kept: tuple[np.ndarray, ...]
    min_count: int

    @staticmethod
    def from_counts(counts: Sequence[tuple[np.ndarray, np.ndarray]], min_count: int
                    ) -> Vocabulary:
        return Vocabulary(tuple(vals[nums >= min_count] for vals, nums in counts), min_count)

    def table_sizes(self) -> list[int]:
        """Rows per field: the empty id, the shared rare id, one per kept value."""
        return [2 + len(k) for k in self.kept]

    def ids(self, values: np.ndarray) -> np.ndarray:
        """(n, 26) int32 ids of raw values under this vocabulary."""
        ids = np.full(values.shape, RARE_ID, np.int32)
        for j, kept in enumerate(self.kept):
            column = values[:, j]
            ids[column == EMPTY, j] = EMPTY_ID
            if len(kept):
                at = np.minimum(np.searchsorted(kept, column), len(kept) - 1)
                found = kept[at] == column
                ids[found, j] = 2 + at[found]
        return ids


# -- reading --------------------------------------------------------------------------


def is_gzip(path: str) -> bool:
    return path.lower().endswith(".gz")


def gzip_budget(path: str) -> int:
    """Bytes gzipped log `path` may expand to (`GZIP_EXPANSION`), lines counted as at least
    `MIN_ROW_BYTES` each."""
    return bounded.expansion_budget(GZIP_EXPANSION, os.path.getsize(path))


def gzip_bomb(path: str, line: int) -> CriteoError:
    """The refusal of a gzipped log that expands past `gzip_budget` by line `line`."""
    return CriteoError(
        f"{bounded.shown(path)}: line {line}: more than {gzip_budget(path)} bytes from "
        f"{os.path.getsize(path)} compressed bytes; click logs compress about 4 times, so more "
        f"than {GZIP_EXPANSION} times is refused (a real log that compresses better can be "
        "read decompressed)")
