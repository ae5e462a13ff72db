"""`hpcdp prep markov --out DIR`: the Markov-chain corpus as token files train.h5, val.h5.

Runs on one process or under ``mpirun`` / ``srun --mpi=pmix``, in the frame of
`hpcdp.data.prep.frame` (docs/prep.md): each rank draws its blocks of documents
(whole batches of `markov.DOCS_PER_BLOCK`, each from its own seed, so the corpus is
the same on any number of ranks) as parts, and all write one file per split from
them. Both files carry the chain's entropy rate as the attribute
``entropy_rate_nats``: the loss no model can beat.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hpcdp.data.format import tokens as tk
from hpcdp.data.prep import frame
from hpcdp.data.prep.blocks import items_per_block, plan_items
from hpcdp.data.prep.recipe import SAME_BYTES, Recipe, Split
from hpcdp.data.prep.text import markov as mk
from hpcdp.data.prep.text import writer as tw
from hpcdp.data.prep.text.markov import MarkovChain
from hpcdp.data.prep.world import PrepError, allreduce

PROG = "hpcdp prep markov"


def _options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--symbols", type=int, default=64, help="symbols besides the end token")
    p.add_argument("--successors", type=int, default=4, help="successors of each symbol")
    p.add_argument("--end-prob", type=float, default=1 / 32,
                   help="probability that a document ends after each symbol")
    p.add_argument("--docs", type=int, default=50_000, help="training documents")
    p.add_argument("--val-docs", type=int, default=2_000, help="validation documents")
    p.add_argument("--seed", type=int, default=0, help="seed of the chain and the documents")


@dataclass(frozen=True)
class Inputs:
    """What the corpus is made from (the files' ``source_params``, and with the block size
    what a resumed run must share), and the chain it describes."""

    symbols: int
    successors: int
    end_prob: float
    seed: int
    docs: int
    val_docs: int
    block_bytes: int
    chain: MarkovChain = field(metadata=SAME_BYTES)  # follows from the above

    @property
    def params(self) -> dict[str, Any]:
        return {"symbols": self.symbols, "successors": self.successors,
                "end_prob": self.end_prob, "seed": self.seed, "docs": self.docs,
                "val_docs": self.val_docs}


def check(args: argparse.Namespace, comm: Any) -> Inputs:
    """Every check of the options, on this rank; the chain they describe."""
    if args.docs < 1 or args.val_docs < 1:
        raise tw.TokenPrepError(f"--docs and --val-docs must be at least 1, got {args.docs} "
                                f"and {args.val_docs}")
    if args.seed < 0:
        raise tw.TokenPrepError(f"--seed must be non-negative, got {args.seed}")
    try:
        chain = mk.random_chain(args.symbols, args.successors, args.end_prob, args.seed)
    except ValueError as exc:
        raise tw.TokenPrepError(f"--symbols/--successors/--end-prob: {exc}") from exc
    return Inputs(chain.symbols, args.successors, chain.end_prob, args.seed, args.docs,
                  args.val_docs, frame.block_bytes(args.block_mib), chain)


def meta(inputs: Inputs, split: str) -> tk.TokenMeta:
    chain = inputs.chain
    return tk.TokenMeta(vocab_size=chain.vocab_size, eod_id=chain.eod,
                        tokenizer=f"markov-{chain.symbols}",
                        tokenizer_sha256=_identity_sha(chain.symbols),
                        split=split, source="markov", source_params=inputs.params,
                        extra={"entropy_rate_nats": mk.entropy_rate(chain)})


def _identity_sha(symbols: int) -> str:
    """Markov tokens are symbol numbers; their "tokenizer" is the symbol count."""
    return hashlib.sha256(f"hpcdp markov symbols v1: {symbols} + EOD".encode()).hexdigest()


def docs_per_block(chain: MarkovChain, block_bytes: int, count: int, dtype: np.dtype) -> int:
    """Whole generator batches of documents, about `block_bytes` of tokens as saved."""
    doc_bytes = (1 / chain.end_prob + 1) * dtype.itemsize  # the mean length, EOD included
    return items_per_block(doc_bytes, block_bytes, count, unit=mk.DOCS_PER_BLOCK)


def splits(inputs: Inputs) -> list[Split]:
    """train and val, each in blocks of whole generator batches of documents."""
    out = []
    for split_id, (name, count) in enumerate((("train", inputs.docs),
                                              ("val", inputs.val_docs))):
        dtype = meta(inputs, name).dtype
        blocks = plan_items(count, docs_per_block(inputs.chain, inputs.block_bytes, count,
                                                  dtype))
        out.append(Split(name, blocks, "documents", "docs", tw.WRITE_TOKENS, "tokens",
                         shift={tk.DOC_OFFSETS: (tk.TOKENS, 1)}, source=(split_id, dtype)))
    return out


def read_block(inputs: Inputs, split: Split, docs: range) -> dict[str, np.ndarray]:
    """A block's part: the tokens of documents `docs` (in the file's dtype) and each one's
    end within them, drawn a generator batch at a time: only the block's tokens are ever
    held whole."""
    split_id, dtype = split.source
    tokens, lengths = [], []
    for lo in range(docs.start, docs.stop, mk.DOCS_PER_BLOCK):
        drawn = mk.sample_documents(inputs.chain, inputs.seed, split_id, lo,
                                    min(docs.stop, lo + mk.DOCS_PER_BLOCK))
        lengths.append(np.array([len(d) for d in drawn], np.int64))
        tokens.append(np.concatenate(drawn).astype(dtype))
    return {"tokens": np.concatenate(tokens), "doc_offsets": np.cumsum(np.concatenate(lengths))}


def largest_token(inputs: Inputs, split: Split, parts: Any, mine: range, comm: Any) -> int:
    """Collective: the largest token id of `split` over every rank's parts."""
    return allreduce(comm, max((int(parts.load(split.name, i)["tokens"].max(initial=0))
                                for i in mine), default=0), op="max")


def datasets(inputs: Inputs, split: Split, f: Any, totals: dict[str, int], top: int
             ) -> dict[str, Any]:
    """The tokens and the document offsets (below their leading 0: `Split.shift`), with
    the token file's attributes."""
    tokens, offsets = tk.create_datasets(f, meta(inputs, split.name), totals[tk.TOKENS],
                                         totals[tk.DOC_OFFSETS], top)
    return {tk.TOKENS: tokens, tk.DOC_OFFSETS: offsets}


def summary(inputs: Inputs, written: list[str], seconds: float, ranks: int) -> None:
    tw.report_written(PROG, written)
    print(f"{PROG}: entropy rate {mk.entropy_rate(inputs.chain):.4f} nats/token; "
          f"{seconds:.2f} s on {ranks} rank(s)", flush=True)


RECIPE = Recipe(
    "markov", "documents from a seeded Markov chain -> token files (entropy rate known)",
    _options, check, lambda inputs: ["train.h5", "val.h5"], splits, read_block, datasets,
    summary, tally=largest_token, prog=PROG, description=__doc__.splitlines()[0],
    bad_input=(tw.TokenPrepError, PrepError, OSError, ImportError))


def main(argv: Sequence[str] | None = None) -> int:
    return frame.main(RECIPE, argv)


if __name__ == "__main__":
    sys.exit(main())
