"""A text block's documents, tokens and written slices are held a bounded piece at a
time, so a rank's memory does not follow the block's size (the default block size grows
with the corpus up to 64 blocks of 64 MiB): one plain JSON Lines file of 32 MiB is one
block here, and the traced peak of tokenizing it and writing its split stays a few MiB."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from hpcdp.data.format import tokens as tk
from hpcdp.data.prep.parts import Parts
from hpcdp.data.prep.progress import Progress
from hpcdp.data.prep.text import corpus as tc
from hpcdp.data.prep.text import passes
from hpcdp.data.prep.text import tokenizer as tz
from hpcdp.data.prep.text import writer as tw
from hpcdp.data.prep.text.recipe import selector
from hpcdp.data.prep.world import SerialComm
from hpcdp.data.synth import corpus as corpus_synth

MIB = 1 << 20
#: The traced peak allowed: the 2 MiB read window, a batch of 1 Mi characters and its
#: tokens, a 1 Mi-token slab; holding the block (32 MiB read, 64 MiB of tokens) is far over.
BOUND = 12 * MIB


def traced_peak(step: Callable[[], Any]) -> tuple[Any, int]:
    """`step`'s result and the peak of memory traced while it ran."""
    tracemalloc.start()
    try:
        return step(), tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_large_block_is_tokenized_and_written_in_bounded_pieces(tmp_path: Path) -> None:
    (path,) = corpus_synth.make_corpus(str(tmp_path / "c"), 32 * MIB, files=1)
    corpus = tc.Corpus([path], lines=False)
    blocks = corpus.blocks(64 * MIB)
    assert len(blocks) == 1
    comm, tok = SerialComm(), tz.byte_level()
    parts = Parts(str(tmp_path / "o"), "text", {}, comm, resume=False)
    progress = Progress(comm, "tokenized", corpus.total, "B")
    error, peak = traced_peak(lambda: passes.tokenize_blocks(corpus, blocks, range(1), tok,
                                                             parts, progress))
    assert error is None and peak < BOUND, peak
    lengths = np.asarray(parts.load(passes.DOCS, 0)["lengths"])
    assert int(lengths.sum()) > 30 * MIB  # the documents without their JSON, tokenized
    meta = tk.TokenMeta(tok.vocab_size, tok.eod_id, tok.name, tok.sha256, "train", "text", {})
    written, peak = traced_peak(lambda: tw.write_split_parts(
        str(tmp_path / "o"), "train", parts, range(1), np.zeros(1, np.int64),
        selector("train", 0.05), meta, comm))
    assert peak < BOUND, peak
    assert tk.validate_tokens(written).num_documents == int((~passes.val_mask(
        0, len(lengths), 0.05)).sum())
