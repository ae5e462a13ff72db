"""Write one token split from every rank's documents into ONE file (collective).

Each rank holds its own share of the documents, already tokenized, in corpus
order (rank r's documents all come before rank r+1's). The ranks find where
their tokens and documents start with exclusive prefix sums (MPI ``Exscan``),
and the totals with an all-reduce; then every rank writes its own contiguous
slice of ``tokens`` and of ``doc_offsets`` through parallel HDF5 (driver
``mpio``, independent transfers: each slice is contiguous and no two ranks
write the same bytes). The file is written under a temporary name and renamed
when complete, so a failed run never replaces a good file (`hpcdp.data.prep.frame`
holds what every recipe shares).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from hpcdp.data.format import tokens as tk
from hpcdp.data.prep import frame as prep_run
from hpcdp.data.prep.frame import PrepError

#: Tokens per write call at most: MPI-IO counts are 32-bit, and smaller calls bound staging.
WRITE_TOKENS = 1 << 26


class TokenPrepError(PrepError):
    """Bad preparation input or options: the message names the file or option."""


def local_errors(docs: Sequence[np.ndarray], meta: tk.TokenMeta, where: str) -> str | None:
    """A problem with this rank's documents, or None: ids outside the vocabulary."""
    for i, doc in enumerate(docs):
        if len(doc) and (int(doc.max()) >= meta.vocab_size or int(doc.min()) < 0):
            bad = doc[(doc >= meta.vocab_size) | (doc < 0)][0]
            return (f"{where}: document {i} of this rank has token id {int(bad)}, outside the "
                    f"vocabulary of {meta.vocab_size}")
    return None


def write_split(out_dir: str, name: str, docs: Sequence[np.ndarray], meta: tk.TokenMeta,
                comm: Any) -> str:
    """Collective: write ``out_dir/NAME.h5`` from every rank's `docs`; return its path.

    Raises `TokenPrepError` on every rank (before the file is created) when the
    split has no documents or a token id is outside the vocabulary.
    """
    final = os.path.join(out_dir, f"{name}.h5")
    prep_run.raise_agreed(comm, local_errors(docs, meta, final), TokenPrepError)
    lengths = np.array([len(d) for d in docs], np.int64)
    n_tok, n_doc = int(lengths.sum()), len(docs)
    tok_start, doc_start = prep_run.exscan(comm, n_tok), prep_run.exscan(comm, n_doc)
    total_tok, total_doc = prep_run.allreduce(comm, n_tok), prep_run.allreduce(comm, n_doc)
    top = prep_run.allreduce(comm, max((int(d.max()) for d in docs if len(d)), default=0), "max")
    if total_doc == 0:
        raise TokenPrepError(f"{final}: the {name} split has no documents")
    with prep_run.replacing(final, comm) as tmp, prep_run.create_h5(tmp, comm) as f:
        tokens, offsets = tk.create_datasets(f, meta, total_tok, total_doc, top)
        _write_tokens(tokens, docs, tok_start, meta.dtype)
        local = tk.offsets_from_lengths(lengths, tok_start)
        if comm.rank == comm.size - 1:
            offsets[doc_start : doc_start + n_doc + 1] = local
        elif n_doc:
            offsets[doc_start : doc_start + n_doc] = local[:-1]
    return final


def _write_tokens(dset: Any, docs: Sequence[np.ndarray], start: int, dtype: np.dtype) -> None:
    """This rank's documents into ``dset[start:...]``, a bounded slab at a time."""
    pending: list[np.ndarray] = []
    size = 0
    for doc in [*docs, None]:
        if doc is not None:
            pending.append(doc)
            size += len(doc)
        if pending and (doc is None or size >= WRITE_TOKENS):
            slab = np.concatenate(pending).astype(dtype)
            dset[start : start + len(slab)] = slab
            start += len(slab)
            pending, size = [], 0


def report_written(prog: str, paths: Sequence[str]) -> None:
    """One line per written token file: what a user checks before training on it."""
    for path in paths:
        info = tk.validate_tokens(path)
        print(f"{prog}: wrote {path}: {info.num_documents} documents, {info.num_tokens} "
              f"tokens (vocabulary {info.vocab_size}, tokenizer {info.tokenizer})", flush=True)


# -- from the parts of a streaming preparation -----------------------------------------


def split_counts(lengths: np.ndarray, keep: np.ndarray) -> tuple[int, int]:
    """(documents, tokens) of one block that one split keeps."""
    return int(keep.sum()), int(lengths[keep].sum())


def write_split_parts(out_dir: str, name: str, parts: Any, mine: range, firsts: np.ndarray,
                      select: Any, meta: tk.TokenMeta, comm: Any) -> str:
    """Collective: ``out_dir/NAME.h5`` from the tokenized blocks' parts (this rank's:
    `mine`), each block's documents that ``select(first_doc, lengths)`` keeps (a boolean
    mask); `firsts` is every block's first global document.

    The two datasets have different lengths (tokens and documents), so each block has
    two offsets, both exclusive prefix sums over the blocks of what the split keeps;
    each rank writes its blocks' slices independently, one block in memory at a time.
    The largest token id is found while writing and set last, the same on every rank.
    """
    final = os.path.join(out_dir, f"{name}.h5")
    mine_counts = []
    for b in mine:
        lengths = np.asarray(parts.load("docs", b)["lengths"])
        mine_counts.append((b, *split_counts(lengths, select(int(firsts[b]), lengths))))
    docs, toks = np.zeros(len(firsts), np.int64), np.zeros(len(firsts), np.int64)
    for got in comm.allgather(mine_counts):
        for b, d, t in got:
            docs[b], toks[b] = d, t
    total_doc, total_tok = int(docs.sum()), int(toks.sum())
    if total_doc == 0:
        raise TokenPrepError(f"{final}: the {name} split has no documents")
    doc_at, tok_at = np.cumsum(docs) - docs, np.cumsum(toks) - toks
    top = 0
    with prep_run.replacing(final, comm) as tmp, prep_run.create_h5(tmp, comm) as f:
        tokens, offsets = tk.create_datasets(f, meta, total_tok, total_doc, 0)
        for b in mine:
            part = parts.load("docs", b)
            lengths = np.asarray(part["lengths"])
            keep = select(int(firsts[b]), lengths)
            kept = np.asarray(part["tokens"])[np.repeat(keep, lengths)]
            del part
            top = max(top, int(kept.max()) if len(kept) else 0)
            _write_tokens(tokens, [kept], int(tok_at[b]), meta.dtype)
            if docs[b]:
                local = tk.offsets_from_lengths(lengths[keep], int(tok_at[b]))
                offsets[doc_at[b] : doc_at[b] + docs[b]] = local[:-1]
        if comm.rank == comm.size - 1:
            offsets[total_doc : total_doc + 1] = [total_tok]
        top = prep_run.allreduce(comm, top, "max")
        if top >= meta.vocab_size:
            raise TokenPrepError(f"{final}: token id {top} is outside the vocabulary of "
                                 f"{meta.vocab_size}")
        f.attrs["max_token_id"] = top
    return final
