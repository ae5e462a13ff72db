"""The documents of one corpus file, by its kind: text, JSON Lines (plain or gzipped), Parquet.

The kind comes from the name (any case): ``.jsonl`` is JSON Lines, ``.jsonl.gz``
and ``.json.gz`` gzipped JSON Lines, ``.parquet`` Parquet, anything else UTF-8
text. A JSON Lines record is one JSON object a line whose string field `field`
is the document; blank lines are skipped. A Parquet file's documents are the
values of its string column `field`, row group by row group. A record whose
field is the empty string is no document, as an empty text file or line is not,
so the same documents give the same token files whatever format holds them.

A line that is not JSON (or not UTF-8), a record that is not an object, lacks
the field or holds a non-string there is a `TokenPrepError` naming the file and
line; in Parquet, the file, row group and row. So is a record JSON cannot hold
as data (a number of more than 4,300 digits, nesting deeper than Python's
recursion limit) and a document with a lone surrogate (``"\\ud800"``), which
no UTF-8 tokenizer can encode. Reading Parquet needs pyarrow (the ``parquet``
extra); without it the error says how to install it.

Memory stays in proportion to the input (`Limits`, docs/input-checks.md): a
record (a JSON Lines line, a ``--lines`` text line, a Parquet value) longer
than ``--max-record-bytes`` is an error naming the file, line (row) and the
option, found while reading at most that many bytes of it; and a compressed
file (gzip, Parquet) may yield at most ``--max-expansion`` times its size in
document bytes (at least that times 64 KiB), checked on the sizes a Parquet file
declares before reading and per batch of values before they are decoded, so
neither a gzip stream nor a dictionary-encoded column can expand without bound.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from hpcdp.data.prep import bounded, inflate
from hpcdp.data.prep.text.writer import TokenPrepError

TEXT, JSONL, JSONL_GZ, PARQUET = "text", "jsonl", "jsonl.gz", "parquet"
#: Name endings of each record kind (matched in lower case).
SUFFIXES = ((".jsonl.gz", JSONL_GZ), (".json.gz", JSONL_GZ), (".jsonl", JSONL),
            (".parquet", PARQUET))
PYARROW_HINT = "pip install pyarrow, or pip install 'hpcdp[parquet]'"
#: Parquet values decoded at a time (their lengths are checked before they are).
PARQUET_BATCH_ROWS = 1024
#: What each line of a compressed file counts toward its budget at least: reading a line costs
#: about as much as this many bytes, so a bomb of blank lines ends in seconds, not minutes.
LINE_COST = 64
#: A lone surrogate: valid in a JSON string escape, but not encodable as UTF-8.
SURROGATE = re.compile("[\ud800-\udfff]")


@dataclass(frozen=True)
class Limits:
    """How large a record, and how much document text a compressed file, may be."""

    record_bytes: int = 64 << 20  # --max-record-bytes
    expansion: int = 100  # --max-expansion

    def budget(self, compressed: int) -> int:
        """Document bytes a compressed file of `compressed` bytes may give."""
        return bounded.expansion_budget(self.expansion, compressed)

    def check_record(self, nbytes: int, where: str) -> None:
        """A record of `nbytes` bytes at `where` (file and line or row) is within the limit."""
        if nbytes > self.record_bytes:
            raise TokenPrepError(f"{where}: a record of more than {self.record_bytes} bytes "
                                 f"(--max-record-bytes {self.record_bytes}; raise it for longer "
                                 "documents)")

    def over_budget(self, compressed: int, where: str) -> TokenPrepError:
        return TokenPrepError(
            f"{where}: more than {self.budget(compressed)} bytes of documents from "
            f"{compressed} compressed bytes (--max-expansion {self.expansion} allows that many "
            "times the file's size, or 64 KiB for a smaller file; raise it if this corpus "
            "compresses better)")


DEFAULT_LIMITS = Limits()


def kind_of(path: str) -> str:
    """The corpus kind of `path` by its name; other gzipped files are an error."""
    name = path.lower()
    for suffix, kind in SUFFIXES:
        if name.endswith(suffix):
            return kind
    if name.endswith(".gz"):
        raise TokenPrepError(f"{path}: gzipped input is read only as JSON Lines (.jsonl.gz "
                             "or .json.gz); decompress text files first")
    return TEXT


def split_by_lines(kind: str, lines: bool) -> bool:
    """Whether a file of `kind` is shared among ranks by lines (else one rank reads it whole):
    plain JSON Lines always, text with ``--lines``."""
    return kind == JSONL or (kind == TEXT and lines)


def require_pyarrow(path: str) -> None:
    """An error naming `path` when pyarrow is missing: checked before anything is read."""
    try:
        import pyarrow.parquet  # noqa: F401 - only whether it imports
    except ImportError as exc:
        raise TokenPrepError(f"{path}: reading Parquet needs pyarrow ({PYARROW_HINT})") from exc


def record_text(line: bytes, field: str, where: str) -> str:
    """The document of one JSON Lines record (`line` without its end; may be blank: "").

    `where` names the file and line in the error."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TokenPrepError(f"{where}: invalid UTF-8 at byte {exc.start} of the line: "
                             f"{exc.reason}") from None
    if not text.strip():
        return ""
    try:
        record = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TokenPrepError(f"{where}: not JSON: {exc.msg} (column {exc.colno})") from None
    except ValueError:  # a number past Python's digit limit for int()
        raise TokenPrepError(f"{where}: cannot be read as data: a number of more than "
                             f"{sys.get_int_max_str_digits()} digits") from None
    except RecursionError:
        raise TokenPrepError(f"{where}: cannot be read as data: arrays or objects nested too "
                             "deeply") from None
    value = field_text(record, field, where)
    bad = SURROGATE.search(value)
    if bad:
        raise TokenPrepError(f"{where}: field {field!r} holds a lone surrogate "
                             f"(U+{ord(bad.group()):04X}) at character {bad.start()}: not "
                             "encodable text")
    return value


def field_text(record: Any, field: str, where: str) -> str:
    """`record[field]`, which must be a string; the error names `where` and what was found."""
    if not isinstance(record, dict):
        raise TokenPrepError(f"{where}: a record must be a JSON object, got "
                             f"{type(record).__name__}")
    if field not in record:
        raise TokenPrepError(f"{where}: the record has no field {field!r} (see --field; it has "
                             f"{', '.join(sorted(map(repr, record))[:8]) or 'no fields'})")
    value = record[field]
    if not isinstance(value, str):
        raise TokenPrepError(f"{where}: field {field!r} is {_kind(value)}, not a string")
    return value


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def gzip_texts(path: str, field: str, limits: Limits = DEFAULT_LIMITS) -> Iterator[str]:
    """The non-empty documents of a gzipped JSON Lines file, in order; each line read at most
    the record limit at a time, the whole within the file's expansion budget."""
    lineno, total = 0, 0
    budget = limits.budget(os.path.getsize(path))
    try:
        with inflate.open_gzip(path) as fh:
            for lineno, raw in enumerate(bounded.lines(fh, limits.record_bytes), 1):
                where = f"{bounded.shown(path)}: line {lineno}"
                line = raw.rstrip(b"\r")
                limits.check_record(len(line), where)
                total += max(len(raw) + 1, LINE_COST)
                if total > budget:
                    raise limits.over_budget(os.path.getsize(path), where)
                text = record_text(line, field, where)
                if text:
                    yield text
    except (OSError, *inflate.ERRORS) as exc:
        raise TokenPrepError(f"{bounded.shown(path)}: cannot be decompressed after line "
                             f"{lineno}: {exc}") from None


def parquet_texts(path: str, field: str, limits: Limits = DEFAULT_LIMITS) -> Iterator[str]:
    """The non-empty documents of a Parquet file's string column `field`, in row order, read
    in batches whose sizes are checked before their values are decoded."""
    require_pyarrow(path)
    import pyarrow as pa
    import pyarrow.parquet as pq

    name = bounded.shown(path)
    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as exc:
        raise TokenPrepError(f"{name}: not a readable Parquet file: {exc}") from None
    names = pf.schema_arrow.names
    if field not in names:
        raise TokenPrepError(f"{name}: no column {field!r} (see --field; it has "
                             f"{', '.join(map(repr, names[:8]))})")
    if names.count(field) > 1:
        raise TokenPrepError(f"{name}: {names.count(field)} columns are named {field!r}; "
                             "which holds the documents is ambiguous")
    budget = _Budget(limits, path, os.path.getsize(path))
    budget.check_declared(pf, field)
    kind = pf.schema_arrow.field(field).type
    for group in range(pf.num_row_groups):
        row = 0
        for column in _batches(pf, group, field, name):
            budget.check_batch(column, f"{name}: row group {group}", row)
            for value in column.to_pylist():
                if not isinstance(value, str):
                    raise TokenPrepError(f"{name}: row group {group}, row {row}: column "
                                         f"{field!r} is {_kind(value)} (type {kind}), not a "
                                         "string")
                row += 1
                if value:
                    yield value


def _batches(pf: Any, group: int, field: str, name: str) -> Iterator[Any]:
    """Row group `group`'s column `field`, a bounded batch of rows at a time."""
    import pyarrow as pa

    try:
        for batch in pf.iter_batches(PARQUET_BATCH_ROWS, row_groups=[group], columns=[field]):
            yield batch.column(0)
    except pa.ArrowException as exc:
        raise TokenPrepError(f"{name}: row group {group}: cannot be read: {exc}") from None


class _Budget:
    """The document bytes one Parquet file may still give (`Limits.budget`)."""

    def __init__(self, limits: Limits, path: str, size: int) -> None:
        self.limits, self.name, self.size = limits, bounded.shown(path), size
        self.left = limits.budget(size)

    def check_declared(self, pf: Any, field: str) -> None:
        """The rows and the uncompressed column sizes the file declares fit the budget."""
        md = pf.metadata
        leaf = [i for i in range(md.num_columns) if md.schema.column(i).path == field]
        declared = md.num_rows + sum(md.row_group(g).column(i).total_uncompressed_size
                                     for g in range(md.num_row_groups) for i in leaf)
        if declared > self.left:
            raise self.limits.over_budget(self.size, self.name)

    def check_batch(self, column: Any, where: str, first_row: int) -> None:
        """The values of `column` (a batch from `first_row`), counted before they are decoded:
        each within the record limit, all within what is left of the budget."""
        import pyarrow as pa
        import pyarrow.compute as pc

        values = column.dictionary if pa.types.is_dictionary(column.type) else column
        lengths = _lengths(values)
        if lengths is None:
            return  # not text: the first value is refused by type
        if pa.types.is_dictionary(column.type):
            lengths = lengths.take(column.indices)
        longest = pc.max(lengths).as_py() or 0
        if longest > self.limits.record_bytes:
            at = pc.index(lengths, longest).as_py()
            self.limits.check_record(longest, f"{where}, row {first_row + at}")
        self.left -= len(column) + (pc.sum(lengths).as_py() or 0)
        if self.left < 0:
            raise self.limits.over_budget(self.size, where)


def _lengths(values: Any) -> Any:
    """The byte length of each string of an Arrow array (nulls as 0), without decoding any;
    None when it does not hold strings."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if pa.types.is_string(values.type) or pa.types.is_large_string(values.type):
        return pc.fill_null(pc.binary_length(values), 0)
    if pa.types.is_string_view(values.type):  # 16-byte views: the length is the first int32
        views = np.frombuffer(values.buffers()[1], np.int32).reshape(-1, 4)
        return pa.array(views[values.offset : values.offset + len(values), 0].astype(np.int64))
    return None
