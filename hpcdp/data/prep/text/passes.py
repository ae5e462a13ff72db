"""The passes of the text recipe over a corpus's blocks, each rank over its own blocks.

- `sample_for_bpe`: the documents a BPE is trained on, at most about ``--bpe-sample-bytes``
  of text, every k-th document of each block and training documents only, the same on
  any number of ranks (the rule below); gathered on rank 0, which trains.
- `tokenize_blocks`: each block's documents read and tokenized a batch at a time into the
  file's dtype and appended to its part (tokens; each document's length and largest id),
  which appears whole when the block is done; a part already there (``--resume``) is kept.

A rank holds a batch of documents and their tokens at a time, even in a block that is a
whole file (gzipped JSON Lines, Parquet: their records cannot be cut into byte ranges),
so its memory does not grow with a file's size; the BPE pass keeps only the sampled
documents. The parts on disk hold the whole corpus's tokens (2 bytes a token for
vocabularies up to 65,536) until the files are written.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from hpcdp.data.format import tokens as tk
from hpcdp.data.prep import blocks as bk
from hpcdp.data.prep import stall
from hpcdp.data.prep.text import tokenizer as tz
from hpcdp.data.prep.text.corpus import Corpus
from hpcdp.data.prep.text.writer import DOCS, TokenPrepError


def val_mask(first: int, n: int, fraction: float) -> np.ndarray:
    """Which of documents ``first .. first + n`` go to validation: document g when
    ``floor((g + 1) f) > floor(g f)``, evenly spread, the same on any number of ranks."""
    g = np.arange(first, first + n, dtype=np.int64)
    return ((g + 1) * fraction).astype(np.int64) > (g * fraction).astype(np.int64)


def tokenize_blocks(corpus: Corpus, blocks: Sequence[bk.Block], mine: range,
                    tok: tz.Tokenizer, parts: Any, progress: Any) -> str | None:
    """Tokenize this rank's blocks into parts, a batch of documents at a time appended to
    the part as it is encoded; the first error, or None."""
    dtype = tk.token_dtype(tok.vocab_size)
    dtypes = {"tokens": dtype, "lengths": np.int64, "tops": dtype}
    for b in mine:
        if not parts.done(DOCS, b):
            try:
                with parts.saving(DOCS, b, **dtypes) as part:
                    for tokens, lengths in tok.encode_batches(corpus.texts(blocks[b])):
                        tops = np.maximum.reduceat(tokens, np.cumsum(lengths) - lengths)
                        part.append(tokens=tokens, lengths=lengths, tops=tops)
                        stall.mark()  # a whole-file block is many batches
            except OSError as exc:  # e.g. a file removed since it was listed
                return f"cannot read the corpus: {exc}"
            except TokenPrepError as exc:
                return str(exc)
            progress.advance(blocks[b].nbytes)
        else:
            progress.advance(blocks[b].nbytes, resumed=True)
    return None


def every_kth(corpus: Corpus, block: bk.Block, k: int
              ) -> tuple[int, list[tuple[int, str]], str | None]:
    """Block `block`'s document count and its documents ``j % k == 0`` (j, text), read a
    document at a time; or the error naming the file (and line or offset)."""
    count, picked = 0, []
    try:
        for j, text in enumerate(corpus.texts(block)):
            if j % k == 0:
                picked.append((j, text))
            count = j + 1
            stall.mark()
    except OSError as exc:  # e.g. a file removed since it was listed
        return count, picked, f"cannot read the corpus: {exc}"
    except TokenPrepError as exc:
        return count, picked, str(exc)
    return count, picked, None


def sample_stride(total_bytes: int, sample_bytes: int) -> int:
    """k: every k-th document of a block is a candidate for the BPE sample."""
    return max(1, -(-total_bytes // max(1, sample_bytes)))


def sample_for_bpe(corpus: Corpus, blocks: Sequence[bk.Block], mine: range, fraction: float,
                   sample_bytes: int, comm: Any, progress: Any = None
                   ) -> tuple[list[str], str | None]:
    """Collective: on rank 0 the BPE's training sample in corpus order (elsewhere []), and
    the first error of any rank.

    Candidates: documents ``j % k == 0`` of each block (`sample_stride` of the corpus's
    bytes), then the validation ones left out once the blocks' document counts give
    each its global number; if the candidates' text is still over `sample_bytes`, every
    m-th is kept. Every step depends on the blocks only, never on the number of ranks.
    `progress` (closed here, collective) hears the bytes read.
    """
    k = sample_stride(corpus.total, sample_bytes)
    picked: list[tuple[int, int, str]] = []  # (block, index in block, text)
    counts: list[tuple[int, int]] = []
    error = None
    for b in mine:
        count, texts, error = every_kth(corpus, blocks[b], k)
        if error:
            break
        counts.append((b, count))
        picked += [(b, j, text) for j, text in texts]
        if progress is not None:
            progress.advance(blocks[b].nbytes)
    if progress is not None:
        progress.close()
    errors = [e for e in comm.allgather(error) if e]
    if errors:
        return [], errors[0]
    docs = np.zeros(len(blocks), np.int64)
    for got in comm.allgather(counts):
        for b, n in got:
            docs[b] = n
    firsts = np.cumsum(docs) - docs
    train = [t for b, j, t in picked if not val_mask(int(firsts[b]) + j, 1, fraction)[0]]
    del picked
    sizes = [len(t.encode()) for t in train]
    before = sum(comm.allgather(len(train))[: comm.rank])
    m = max(1, -(-sum(comm.allgather(sum(sizes))) // max(1, sample_bytes)))
    keep = [t for i, t in enumerate(train) if (before + i) % m == 0]
    gathered = comm.gather(keep, root=0)
    return ([t for share in gathered for t in share] if comm.rank == 0 else []), None
