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
line; in Parquet, the file, row group and row. Reading Parquet needs pyarrow
(the ``parquet`` extra); without it the error says how to install it.
"""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Iterator
from typing import Any

from hpcdp.data.prep.text.writer import TokenPrepError

TEXT, JSONL, JSONL_GZ, PARQUET = "text", "jsonl", "jsonl.gz", "parquet"
#: Name endings of each record kind (matched in lower case).
SUFFIXES = ((".jsonl.gz", JSONL_GZ), (".json.gz", JSONL_GZ), (".jsonl", JSONL),
            (".parquet", PARQUET))
PYARROW_HINT = "pip install pyarrow, or pip install 'hpcdp[parquet]'"


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
    return field_text(record, field, where)


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


def gzip_texts(path: str, field: str) -> Iterator[str]:
    """The non-empty documents of a gzipped JSON Lines file, in order."""
    lineno = 0
    try:
        with gzip.open(path, "rb") as fh:
            for lineno, raw in enumerate(fh, 1):
                text = record_text(raw.rstrip(b"\n").rstrip(b"\r"), field,
                                   f"{path}: line {lineno}")
                if text:
                    yield text
    except (OSError, EOFError, zlib.error) as exc:
        raise TokenPrepError(f"{path}: cannot be decompressed after line {lineno}: "
                             f"{exc}") from None


def parquet_texts(path: str, field: str) -> Iterator[str]:
    """The non-empty documents of a Parquet file's string column `field`, in row order."""
    require_pyarrow(path)
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as exc:
        raise TokenPrepError(f"{path}: not a readable Parquet file: {exc}") from None
    names = pf.schema_arrow.names
    if field not in names:
        raise TokenPrepError(f"{path}: no column {field!r} (see --field; it has "
                             f"{', '.join(map(repr, names[:8]))})")
    kind = pf.schema_arrow.field(field).type
    for group in range(pf.num_row_groups):
        try:
            values = pf.read_row_group(group, columns=[field]).column(0).to_pylist()
        except pa.ArrowException as exc:
            raise TokenPrepError(f"{path}: row group {group}: cannot be read: {exc}") from None
        for row, value in enumerate(values):
            if not isinstance(value, str):
                raise TokenPrepError(f"{path}: row group {group}, row {row}: column {field!r} "
                                     f"is {_kind(value)} (type {kind}), not a string")
            if value:
                yield value
