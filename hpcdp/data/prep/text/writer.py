"""Write one token split of a tokenized corpus into ONE file from the blocks' parts
(collective).

Each rank has tokenized its blocks into parts (tokens, and each document's token
count), both splits together: which documents are validation documents depends on
their global numbers, known only once every block's document count is. So a split's
file is written from the parts with a selection: every block's documents that the
split keeps (`write_split_parts`). The two datasets have different lengths (tokens,
documents), so a block has one offset in each: exclusive prefix sums, in block order,
of what the split keeps of every block. Each rank writes its own blocks' slices
independently through parallel HDF5 (driver ``mpio``: the slices are contiguous and no
two ranks write the same bytes), holding one block at a time. The file is written
under a temporary name and renamed when complete, so a failed run never replaces a
good file (`hpcdp.data.prep.frame` holds what every recipe shares). Recipes whose
parts are already one split each (the Markov corpus) use `merge.write_parts` instead.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from hpcdp.data.format import tokens as tk
from hpcdp.data.prep import stall
from hpcdp.data.prep.merge import create_h5, replacing
from hpcdp.data.prep.world import PrepError, allreduce

#: Tokens per write call at most: MPI-IO counts are 32-bit, and smaller calls bound staging.
WRITE_TOKENS = 1 << 26
#: Tokens of a block copied to a file at once (2 MiB of uint16): with the mapped part's
#: pages and the kept copy, what a rank holds while writing, whatever the block's size.
SLAB_TOKENS = 1 << 20


class TokenPrepError(PrepError):
    """Bad preparation input or options: the message names the file or option."""


def doc_slabs(lengths: np.ndarray, slab: int = SLAB_TOKENS) -> list[tuple[int, int]]:
    """Documents ``[lo, hi)`` of a block, cut where their first token crosses a multiple of
    `slab` tokens: whole documents, about `slab` tokens each (a longer document alone)."""
    starts = np.cumsum(lengths) - lengths
    cuts = np.unique(np.searchsorted(starts, np.arange(0, int(lengths.sum()), slab)))
    bounds = [*cuts.tolist(), len(lengths)]
    return [(a, z) for a, z in zip(bounds, bounds[1:]) if z > a]


def _copy_kept(parts: Any, block: int, lengths: np.ndarray, keep: np.ndarray, dset: Any,
               start: int) -> int:
    """Block `block`'s kept documents' tokens into ``dset[start:...]``, a slab at a time
    (the part mapped afresh for each, so its pages never add up); their largest id."""
    ends = np.cumsum(lengths)
    top = 0
    for lo, hi in doc_slabs(lengths):
        if not keep[lo:hi].any():
            continue
        mapped = parts.load("docs", block)["tokens"]
        kept = np.asarray(mapped[ends[lo] - lengths[lo] : ends[hi - 1]]
                          [np.repeat(keep[lo:hi], lengths[lo:hi])])
        del mapped
        dset[start : start + len(kept)] = kept
        start += len(kept)
        top = max(top, int(kept.max()))
        stall.mark()
    return top


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
    with replacing(final, comm) as tmp, create_h5(tmp, comm) as f:
        tokens, offsets = tk.create_datasets(f, meta, total_tok, total_doc, 0)
        for b in mine:
            lengths = np.asarray(parts.load("docs", b)["lengths"])
            keep = select(int(firsts[b]), lengths)
            top = max(top, _copy_kept(parts, b, lengths, keep, tokens, int(tok_at[b])))
            if docs[b]:
                local = tk.offsets_from_lengths(lengths[keep], int(tok_at[b]))
                offsets[doc_at[b] : doc_at[b] + docs[b]] = local[:-1]
        if comm.rank == comm.size - 1:
            offsets[total_doc : total_doc + 1] = [total_tok]
        top = allreduce(comm, top, "max")
        if top >= meta.vocab_size:
            raise TokenPrepError(f"{final}: token id {top} is outside the vocabulary of "
                                 f"{meta.vocab_size}")
        f.attrs["max_token_id"] = top
    return final
