"""One token split of a tokenized corpus, written from the blocks' parts by the merge every
recipe uses (`merge.write_parts`; collective).

Each rank has tokenized its blocks into parts (tokens; each document's token count and
largest id), both splits together: which documents are validation documents depends on
their global numbers, known only once every block's document count is. So a split is a
selection of each block's documents (``select(first_doc, lengths)``, a mask), and
`Selected` shows the merge that selection as parts of their own: a block's kept tokens,
gathered a slab at a time straight from its part (nothing is copied to disk again), and
the kept documents' first tokens (the last block's also the end of its last). The merge
writes a block's tokens, then its offsets, as one writer would, so 1 rank writes the file
it always did and any number of ranks the same file.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from hpcdp.data.format import tokens as tk
from hpcdp.data.prep.merge import part_layout, write_parts
from hpcdp.data.prep.world import PrepError, allreduce

#: The split name of the tokenized blocks in the work folder (both splits together).
DOCS = "docs"
#: Tokens per write call at most: MPI-IO counts are 32-bit, and smaller calls bound staging.
WRITE_TOKENS = 1 << 26
#: Tokens of a split copied to its file at once (2 MiB of uint16): with the part's pages
#: mapped for it, what a rank holds while writing, whatever the block's size.
SLAB_TOKENS = 1 << 20
#: Tokens gathered from a part at once within a slab: the gather's index (8 bytes a token)
#: stays a fraction of the slab.
GATHER_TOKENS = 1 << 18


class TokenPrepError(PrepError):
    """Bad preparation input or options: the message names the file or option."""


class _Kept:
    """One block's selection: where each kept document starts among the kept tokens
    (`starts`, `ends`) and how far its tokens lie further on in the part (`shift`)."""

    def __init__(self, lengths: np.ndarray, keep: np.ndarray, tops: np.ndarray,
                 last: bool) -> None:
        kept = lengths[keep]
        self.ends = np.cumsum(kept)
        self.starts = self.ends - kept
        self.shift = (np.cumsum(lengths) - lengths)[keep] - self.starts
        self.tokens = int(self.ends[-1]) if len(kept) else 0
        self.top = int(tops[keep].max(initial=0))
        self.offsets = np.append(self.starts, self.tokens) if last else self.starts

    def gather(self, tokens: np.ndarray, a: int, b: int) -> np.ndarray:
        """Kept tokens ``[a, b)`` from the block's `tokens`, `GATHER_TOKENS` at a time."""
        out = np.empty(b - a, tokens.dtype)
        for lo in range(a, b, GATHER_TOKENS):
            hi = min(b, lo + GATHER_TOKENS)
            d0 = int(np.searchsorted(self.ends, lo, "right"))
            d1 = int(np.searchsorted(self.starts, hi, "left"))
            if self.shift[d0] == self.shift[d1 - 1]:  # documents next to each other
                out[lo - a : hi - a] = tokens[lo + self.shift[d0] : hi + self.shift[d0]]
                continue
            counts = np.minimum(self.ends[d0:d1], hi) - np.maximum(self.starts[d0:d1], lo)
            where = np.repeat(self.shift[d0:d1], counts)
            where += np.arange(lo, hi)
            out[lo - a : hi - a] = tokens[where]
        return out


class _KeptTokens:
    """A block's kept tokens as an array the merge slices: each slice gathered when read."""

    def __init__(self, tokens: np.ndarray, kept: _Kept) -> None:
        self.tokens, self.kept = tokens, kept

    def __getitem__(self, rows: slice) -> np.ndarray:
        a, b, _ = rows.indices(self.kept.tokens)
        return self.kept.gather(self.tokens, a, max(a, b))


class Selected:
    """The documents of each block's part that ``select(first, lengths)`` keeps, seen as
    parts of one split: arrays `tokens` and `doc_offsets` (what `merge.write_parts`
    reads). One block's selection is held at a time."""

    def __init__(self, parts: Any, firsts: np.ndarray, select: Any) -> None:
        self.parts, self.firsts, self.select = parts, firsts, select
        self._held: tuple[int, _Kept | None] = (-1, None)

    def kept(self, block: int) -> _Kept:
        held, kept = self._held
        if held != block or kept is None:
            part = self.parts.load(DOCS, block)
            lengths = np.asarray(part["lengths"])
            keep = self.select(int(self.firsts[block]), lengths)
            tops = part.get("tops")
            if tops is None:  # a part saved before parts recorded them (a resumed run)
                tops = (np.maximum.reduceat(part["tokens"], np.cumsum(lengths) - lengths)
                        if len(lengths) else lengths)
            kept = _Kept(lengths, keep, np.asarray(tops), block == len(self.firsts) - 1)
            self._held = (block, kept)
        return kept

    def lengths(self, split: str, block: int) -> dict[str, int]:
        kept = self.kept(block)
        return {tk.TOKENS: kept.tokens, tk.DOC_OFFSETS: len(kept.offsets)}

    def tally(self, split: str, block: int) -> dict[str, int]:
        """No counts beside the rows: what `merge.part_layout` sums is the rows alone."""
        return {}

    def load(self, split: str, block: int) -> dict[str, Any]:
        kept = self.kept(block)
        return {tk.TOKENS: _KeptTokens(self.parts.load(DOCS, block)["tokens"], kept),
                tk.DOC_OFFSETS: kept.offsets}


def report_written(prog: str, paths: Sequence[str]) -> None:
    """One line per written token file: what a user checks before training on it."""
    for path in paths:
        info = tk.validate_tokens(path)
        print(f"{prog}: wrote {path}: {info.num_documents} documents, {info.num_tokens} "
              f"tokens (vocabulary {info.vocab_size}, tokenizer {info.tokenizer})", flush=True)


def write_split_parts(out_dir: str, name: str, parts: Any, mine: range, firsts: np.ndarray,
                      select: Any, meta: tk.TokenMeta, comm: Any) -> str:
    """Collective: ``out_dir/NAME.h5`` from the tokenized blocks' parts (this rank's:
    `mine`), each block's documents that ``select(first_doc, lengths)`` keeps (a boolean
    mask); `firsts` is every block's first global document. The largest token id, from
    the parts' per-document ones, is checked against the vocabulary before the file is
    made."""
    final = os.path.join(out_dir, f"{name}.h5")
    view = Selected(parts, firsts, select)
    layout = part_layout(view, name, mine, comm)
    total_doc = layout.totals[tk.DOC_OFFSETS] - 1
    if total_doc == 0:
        raise TokenPrepError(f"{final}: the {name} split has no documents")
    top = allreduce(comm, max((view.kept(b).top for b in mine), default=0), "max")
    if top >= meta.vocab_size:
        raise TokenPrepError(f"{final}: token id {top} is outside the vocabulary of "
                             f"{meta.vocab_size}")

    def datasets(f: Any, total_tok: int) -> dict[str, Any]:
        tokens, offsets = tk.create_datasets(f, meta, total_tok, total_doc, 0)
        f.attrs["max_token_id"] = top
        return {tk.TOKENS: tokens, tk.DOC_OFFSETS: offsets}

    write_parts(final, view, name, mine, datasets, comm, SLAB_TOKENS, layout=layout,
                shift={tk.DOC_OFFSETS: (tk.TOKENS, 0)}, by_array=True)
    return final
