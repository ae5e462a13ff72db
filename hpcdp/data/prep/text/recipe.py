"""`datasets/text.py --out DIR --files GLOB...`: text, JSON Lines or Parquet -> token files.

Text files: one document per file, or with ``--lines`` one per non-empty line
(the line end not included). JSON Lines (``.jsonl``, ``.jsonl.gz``,
``.json.gz``) and Parquet (``.parquet``): one document per record, the string
field ``--field`` (`hpcdp.data.prep.text.documents` reads each kind). Runs on one
process or under ``mpirun`` / ``srun --mpi=pmix``:

1. Every rank lists the same sorted files. Each takes a contiguous share by
   bytes: the lines (records) of plain JSON Lines files, and with ``--lines``
   of text files, that start in its byte range of the files laid end to end;
   every other file whole, read by the rank whose range holds its first byte.
2. Each rank reads its documents (every record checked); the ranks agree on
   the first error, then number their documents with an exclusive prefix sum; document g
   goes to validation when ``floor((g+1)f) > floor(g f)`` for ``--val-fraction f``:
   evenly spread, and the same on any number of ranks.
3. ``--tokenizer bpe``: rank 0 trains a byte-level BPE on the training documents
   and shares it; ``--tokenizer PATH``: an existing tokenizer.json; default bytes.
4. Each rank tokenizes its documents; all write train.h5 and val.h5
   (`hpcdp.data.prep.text.writer`), and tokenizer.json beside them for BPE.

Each rank holds its share's documents and tokens in memory until the write:
use more ranks for a corpus larger than the ranks' memory. Invalid UTF-8 is an
error naming the file and byte offset (a bad record: file and line, or row
group and row); every error is agreed on by all
ranks before any file is written, and no existing output is replaced unless
``--overwrite``.
"""

from __future__ import annotations

import argparse
import glob
import itertools
import mmap
import os
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from hpcdp import files
from hpcdp.data.format import tokens as tk
from hpcdp.data.prep import bounded
from hpcdp.data.prep import frame as prep_run
from hpcdp.data.prep.text import documents as dc
from hpcdp.data.prep.text import tokenizer as tz
from hpcdp.data.prep.text import writer as tw
from hpcdp.runtime.crash import report_crashes

PROG = "datasets/text.py"
Doc = TypeVar("Doc")


@dataclass(frozen=True)
class Span:
    """Bytes ``[start, stop)`` of file `file`: one text document or JSON Lines record, or a
    whole gzipped or Parquet file (its records)."""

    file: int
    start: int
    stop: int


# -- pure layout ----------------------------------------------------------------------


def expand_files(patterns: Sequence[str]) -> list[str]:
    """Sorted, distinct regular files matched by `patterns`; a pattern matching none is an
    error that names it."""
    found: set[str] = set()
    for pattern in patterns:
        hits = [p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p)]
        if not hits:
            raise tw.TokenPrepError(f"--files {pattern}: matches no file")
        found.update(os.path.abspath(p) for p in hits)
    return sorted(found)


def byte_range(total: int, rank: int, size: int) -> tuple[int, int]:
    """Rank `rank`'s share ``[lo, hi)`` of `total` bytes."""
    return rank * total // size, (rank + 1) * total // size


def file_owner(starts: Sequence[int], total: int, size: int) -> list[int]:
    """The rank of each file: the one whose byte range holds the file's first byte."""
    return [min(size - 1, s * size // total) if total else 0 for s in starts]


def is_val(index: int, fraction: float) -> bool:
    """Whether global document `index` is a validation document (evenly spread)."""
    return int((index + 1) * fraction) > int(index * fraction)


def line_spans(data: Any, file: int, lo: int, hi: int) -> list[Span]:
    """Non-empty lines of `data` that start in ``[lo, hi)``, without ``\\n`` or ``\\r\\n``."""
    if lo == 0:
        pos = 0
    else:
        nl = data.find(b"\n", lo - 1)
        pos = len(data) if nl < 0 else nl + 1
    spans = []
    while pos < hi:
        end = data.find(b"\n", pos)
        end = len(data) if end < 0 else end
        stop = end - 1 if end > pos and data[end - 1 : end] == b"\r" else end
        if stop > pos:
            spans.append(Span(file, pos, stop))
        pos = end + 1
    return spans


# -- reading --------------------------------------------------------------------------


class Corpus:
    """The listed files and this rank's documents in them."""

    def __init__(self, paths: list[str], lines: bool, field: str = "text",
                 limits: dc.Limits = dc.DEFAULT_LIMITS) -> None:
        self.paths, self.lines, self.field, self.limits = paths, lines, field, limits
        self.kinds = [dc.kind_of(p) for p in paths]
        self.sizes = [os.path.getsize(p) for p in paths]
        self.starts = [int(s) for s in np.cumsum([0, *self.sizes])[:-1]]
        self.total = sum(self.sizes)

    def spans(self, rank: int, size: int) -> list[Span]:
        """Rank `rank`'s spans, in corpus order (ranks in order give every document)."""
        owners = file_owner(self.starts, self.total, size)
        lo, hi = byte_range(self.total, rank, size)
        spans: list[Span] = []
        for i, (start, n) in enumerate(zip(self.starts, self.sizes)):
            if not dc.split_by_lines(self.kinds[i], self.lines):
                if owners[i] == rank and n:
                    spans.append(Span(i, 0, n))
                continue
            a, b = max(lo, start) - start, min(hi, start + n) - start
            if a < b:
                with self._map(i) as data:
                    spans += line_spans(data, i, a, b)
        return spans

    def _map(self, file: int) -> Any:
        with open(self.paths[file], "rb") as fh:
            return mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)

    def texts(self, spans: Sequence[Span]) -> Iterator[str]:
        """The documents of `spans` in order: a text span decoded as UTF-8 (bad bytes are an
        error naming the file and offset); the non-empty records of a record file."""
        for file, group in itertools.groupby(spans, key=lambda span: span.file):
            kind, path = self.kinds[file], self.paths[file]
            if kind == dc.JSONL_GZ:
                yield from dc.gzip_texts(path, self.field, self.limits)
            elif kind == dc.PARQUET:
                yield from dc.parquet_texts(path, self.field, self.limits)
            elif kind == dc.JSONL:
                with self._map(file) as data:
                    yield from self._records(path, data, group)
            else:
                limit = self.limits if self.lines else None
                with self._map(file) as data:
                    yield from _decoded(path, data, group, limit)

    def _records(self, path: str, data: Any, spans: Iterator[Span]) -> Iterator[str]:
        """The non-empty documents of JSON Lines `spans` (lines, in order) of one file."""
        line, counted = 1, 0
        for span in spans:
            line += data[counted : span.start].count(b"\n")
            counted = span.start
            where = f"{bounded.shown(path)}: line {line}"
            self.limits.check_record(span.stop - span.start, where)
            text = dc.record_text(data[span.start : span.stop], self.field, where)
            if text:
                yield text


def _decoded(path: str, data: Any, spans: Iterator[Span], limits: dc.Limits | None
             ) -> Iterator[str]:
    """Text spans as UTF-8; with `limits` (``--lines``), each line within the record limit."""
    for span in spans:
        if limits is not None:
            limits.check_record(span.stop - span.start,
                                f"{bounded.shown(path)}: byte offset {span.start}")
        raw = data[span.start : span.stop]
        try:
            yield raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise tw.TokenPrepError(f"{path}: invalid UTF-8 at byte offset "
                                    f"{span.start + exc.start}: {exc.reason}") from None


# -- the steps ------------------------------------------------------------------------


def split_docs(docs: list[Doc], first: int, fraction: float) -> tuple[list[Doc], list[Doc]]:
    """(train, val) documents given the global index `first` of this rank's first document."""
    train: list[Doc] = []
    val: list[Doc] = []
    for i, doc in enumerate(docs):
        (val if is_val(first + i, fraction) else train).append(doc)
    return train, val


def make_tokenizer(args: argparse.Namespace, corpus: Corpus, comm: Any) -> tz.Tokenizer:
    """Collective: the tokenizer the options ask for, the same on every rank."""
    if args.tokenizer == "bytes":
        return tz.byte_level()
    if args.tokenizer != "bpe":
        return tz.load_json(args.tokenizer, args.eod_token)
    text, error = None, None
    if comm.rank == 0:  # the library trains on one node, on all its threads
        try:
            every = corpus.texts(corpus.spans(0, 1))
            train = (t for i, t in enumerate(every) if not is_val(i, args.val_fraction))
            text = tz.train_bpe(train, args.vocab_size, args.eod_token).json
        except (tz.TokenizerError, tw.TokenPrepError) as exc:
            error = str(exc)
    text, error = comm.bcast((text, error), root=0)
    if error:
        raise tw.TokenPrepError(error)
    return tz.from_json(text, "tokenizer.json", args.eod_token)


def tokenize_share(args: argparse.Namespace, corpus: Corpus, comm: Any
                   ) -> tuple[tz.Tokenizer, dict[str, list[np.ndarray]]]:
    """Collective: the tokenizer and this rank's tokenized documents per split."""
    texts: list[str] = []
    error = None
    try:
        texts = list(corpus.texts(corpus.spans(comm.rank, comm.size)))
    except OSError as exc:  # e.g. a file removed since it was listed
        error = f"cannot read the corpus: {exc}"
    except tw.TokenPrepError as exc:
        error = str(exc)
    prep_run.raise_agreed(comm, error, tw.TokenPrepError)
    train, val = split_docs(texts, prep_run.exscan(comm, len(texts)), args.val_fraction)
    check_counts(comm, {"train": train, "val": val}, args.val_fraction)
    tok = None
    try:
        tok = make_tokenizer(args, corpus, comm)
    except (tz.TokenizerError, tw.TokenPrepError) as exc:
        error = str(exc)
    prep_run.raise_agreed(comm, error, tw.TokenPrepError)
    assert tok is not None
    docs: dict[str, list[np.ndarray]] = {}
    for name, part in (("train", train), ("val", val)):
        docs[name] = tok.encode(part)
    return tok, docs


def check_counts(comm: Any, docs: dict[str, list[str]], fraction: float) -> None:
    """Collective: an empty corpus or an empty split is an error on every rank."""
    counts = {name: sum(comm.allgather(len(d))) for name, d in docs.items()}
    if counts["train"] + counts["val"] == 0:
        raise tw.TokenPrepError("--files: no documents (every file or line is empty)")
    if counts["train"] == 0:
        raise tw.TokenPrepError(f"no training documents: {counts['val']} in all, and "
                                f"--val-fraction {fraction} takes them all")
    if fraction > 0 and counts["val"] == 0:
        raise tw.TokenPrepError(
            f"--val-fraction {fraction} of {counts['train']} documents is none: raise it or "
            "add documents (or pass --val-fraction 0 for no val.h5)")


def meta_for(tok: tz.Tokenizer, split: str, args: argparse.Namespace) -> tk.TokenMeta:
    params = {"files": args.files, "lines": args.lines, "field": args.field,
              "val_fraction": args.val_fraction,
              "tokenizer": args.tokenizer}
    return tk.TokenMeta(tok.vocab_size, tok.eod_id, tok.name, tok.sha256, split, "text", params)


def save_tokenizer(out: str, tok: tz.Tokenizer, comm: Any) -> str | None:
    """Rank 0 writes tokenizer.json beside the data (temporary name, then rename)."""
    if tok.json is None:
        return None
    final = os.path.join(out, "tokenizer.json")
    if comm.rank == 0:
        files.write_atomic(final, tok.json)
    return final


# -- command line ---------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="output folder (train.h5, val.h5)")
    p.add_argument("--files", nargs="+", required=True, metavar="GLOB",
                   help="text files (UTF-8), JSON Lines (.jsonl, .jsonl.gz, .json.gz) or Parquet "
                        "(.parquet); globs are expanded here ('**' recurses)")
    p.add_argument("--lines", action="store_true",
                   help="text files: one document per non-empty line (default: one per file)")
    p.add_argument("--field", default="text",
                   help="JSON Lines and Parquet: the string field (column) holding each "
                        "document (default: text)")
    p.add_argument("--tokenizer", default="bytes",
                   help="'bytes' (default: 256 byte ids + end of document), 'bpe' (train a "
                        "byte-level BPE on the training documents, saved as tokenizer.json), "
                        "or the path of an existing tokenizer.json")
    p.add_argument("--vocab-size", type=int, default=4096, help="vocabulary of a trained BPE")
    p.add_argument("--eod-token", default=tz.DEFAULT_EOD,
                   help="the end-of-document token of a BPE or tokenizer.json")
    p.add_argument("--val-fraction", type=float, default=0.05,
                   help="documents for val.h5, evenly spread (0: no val.h5)")
    p.add_argument("--max-record-bytes", type=int, default=dc.Limits.record_bytes,
                   help="the longest JSON Lines record, Parquet value or --lines line "
                        "accepted (default: 64 MiB); see docs/input-checks.md")
    p.add_argument("--max-expansion", type=int, default=dc.Limits.expansion,
                   help="gzip and Parquet files: at most this many times their size (at least "
                        "64 KiB) in documents (default: 100)")
    p.add_argument("--overwrite", action="store_true", help="replace existing output files")
    return p


def _copies_tokenizer(args: argparse.Namespace) -> bool:
    """Whether tokenizer.json is written beside the data (not when it is already there)."""
    target = os.path.join(args.out, "tokenizer.json")
    if args.tokenizer == "bytes":
        return False
    return args.tokenizer == "bpe" or not (os.path.exists(target)
                                           and os.path.samefile(args.tokenizer, target))


def _outputs(args: argparse.Namespace) -> list[str]:
    names = ["train.h5"] + (["val.h5"] if args.val_fraction > 0 else [])
    return names + (["tokenizer.json"] if _copies_tokenizer(args) else [])


def _setup(args: argparse.Namespace, comm: Any) -> Corpus:
    """Every check of the options, on this rank; the corpus they name."""
    prep_run.check_world(comm.size)
    if not 0 <= args.val_fraction < 1:
        raise tw.TokenPrepError(f"--val-fraction must be in [0, 1), got {args.val_fraction}")
    if args.tokenizer not in ("bytes", "bpe") and not os.path.isfile(args.tokenizer):
        raise tw.TokenPrepError(f"--tokenizer {args.tokenizer}: no such file (or use 'bytes' "
                                "or 'bpe')")
    for option, value in (("--max-record-bytes", args.max_record_bytes),
                          ("--max-expansion", args.max_expansion)):
        if value < 1:
            raise tw.TokenPrepError(f"{option} must be at least 1, got {value}")
    corpus = Corpus(expand_files(args.files), args.lines, args.field,
                    dc.Limits(args.max_record_bytes, args.max_expansion))
    for path, kind in zip(corpus.paths, corpus.kinds):
        if kind == dc.PARQUET:
            dc.require_pyarrow(path)
            break
    prep_run.check_outputs(args.out, _outputs(args), args.overwrite)
    return corpus


def _write(args: argparse.Namespace, corpus: Corpus, comm: Any) -> tuple[list[str], str | None]:
    """Collective: tokenize this rank's share and write the splits (and tokenizer.json);
    the paths written."""
    tok, docs = tokenize_share(args, corpus, comm)
    written = [tw.write_split(args.out, split, docs[split], meta_for(tok, split, args), comm)
               for split in (("train", "val") if args.val_fraction > 0 else ("train",))]
    return written, save_tokenizer(args.out, tok, comm) if _copies_tokenizer(args) else None


def _summary(result: tuple[list[str], str | None], seconds: float, ranks: int) -> None:
    written, saved = result
    tw.report_written(PROG, written)
    if saved:
        print(f"{PROG}: wrote {saved}", flush=True)
    print(f"{PROG}: {seconds:.2f} s on {ranks} rank(s)", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    report_crashes()
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    comm = prep_run.world()
    return prep_run.run(PROG, comm, lambda: _setup(args, comm),
                        lambda corpus: _write(args, corpus, comm),
                        lambda result, seconds: _summary(result, seconds, comm.size))


if __name__ == "__main__":
    sys.exit(main())
