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
import os
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from hpcdp.data.format import tokens as tk
from hpcdp.data.prep import frame
from hpcdp.data.prep.blocks import items_per_block, plan_items, rank_blocks
from hpcdp.data.prep.merge import part_layout, write_parts
from hpcdp.data.prep.parts import Parts, fingerprint
from hpcdp.data.prep.progress import Progress
from hpcdp.data.prep.text import markov as mk
from hpcdp.data.prep.text import writer as tw
from hpcdp.data.prep.text.markov import MarkovChain
from hpcdp.data.prep.world import allreduce, check_world, world
from hpcdp.runtime.crash import report_crashes

PROG = "hpcdp prep markov"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="output folder (train.h5, val.h5)")
    p.add_argument("--symbols", type=int, default=64, help="symbols besides the end token")
    p.add_argument("--successors", type=int, default=4, help="successors of each symbol")
    p.add_argument("--end-prob", type=float, default=1 / 32,
                   help="probability that a document ends after each symbol")
    p.add_argument("--docs", type=int, default=50_000, help="training documents")
    p.add_argument("--val-docs", type=int, default=2_000, help="validation documents")
    p.add_argument("--seed", type=int, default=0, help="seed of the chain and the documents")
    p.add_argument("--overwrite", action="store_true", help="replace existing output files")
    frame.add_common_options(p)
    return p


def _chain(args: argparse.Namespace) -> MarkovChain:
    if args.docs < 1 or args.val_docs < 1:
        raise tw.TokenPrepError(f"--docs and --val-docs must be at least 1, got {args.docs} "
                                f"and {args.val_docs}")
    if args.seed < 0:
        raise tw.TokenPrepError(f"--seed must be non-negative, got {args.seed}")
    try:
        return mk.random_chain(args.symbols, args.successors, args.end_prob, args.seed)
    except ValueError as exc:
        raise tw.TokenPrepError(f"--symbols/--successors/--end-prob: {exc}") from exc


def _params(chain: MarkovChain, args: argparse.Namespace) -> dict[str, Any]:
    """What the corpus is made from: the files' ``source_params``, and with the block size
    what a resumed run must share with the run it continues."""
    return {"symbols": chain.symbols, "successors": args.successors,
            "end_prob": chain.end_prob, "seed": args.seed, "docs": args.docs,
            "val_docs": args.val_docs}


def _meta(chain: MarkovChain, args: argparse.Namespace, split: str, h: float
          ) -> tk.TokenMeta:
    params = _params(chain, args)
    return tk.TokenMeta(vocab_size=chain.vocab_size, eod_id=chain.eod,
                        tokenizer=f"markov-{chain.symbols}",
                        tokenizer_sha256=_identity_sha(chain.symbols),
                        split=split, source="markov", source_params=params,
                        extra={"entropy_rate_nats": h})


def _identity_sha(symbols: int) -> str:
    """Markov tokens are symbol numbers; their "tokenizer" is the symbol count."""
    return hashlib.sha256(f"hpcdp markov symbols v1: {symbols} + EOD".encode()).hexdigest()


def _check(args: argparse.Namespace, comm: Any) -> MarkovChain:
    """Every check of the options, on this rank; the chain they describe."""
    check_world(comm.size)
    chain = _chain(args)
    frame.block_bytes(args.block_mib)
    frame.check_outputs(args.out, ["train.h5", "val.h5"], args.overwrite, resume=args.resume)
    return chain


def docs_per_block(chain: MarkovChain, block_bytes: int, count: int, dtype: np.dtype) -> int:
    """Whole generator batches of documents, about `block_bytes` of tokens as saved."""
    doc_bytes = (1 / chain.end_prob + 1) * dtype.itemsize  # the mean length, EOD included
    return items_per_block(doc_bytes, block_bytes, count, unit=mk.DOCS_PER_BLOCK)


def draw_block(chain: MarkovChain, seed: int, split_id: int, docs: range, dtype: np.dtype
               ) -> dict[str, np.ndarray]:
    """A block's part: the tokens of documents `docs` (in the file's dtype) and each one's
    end within them, drawn a generator batch at a time: only the block's tokens are ever
    held whole."""
    tokens, lengths = [], []
    for lo in range(docs.start, docs.stop, mk.DOCS_PER_BLOCK):
        drawn = mk.sample_documents(chain, seed, split_id, lo,
                                    min(docs.stop, lo + mk.DOCS_PER_BLOCK))
        lengths.append(np.array([len(d) for d in drawn], np.int64))
        tokens.append(np.concatenate(drawn).astype(dtype))
    return {"tokens": np.concatenate(tokens), "doc_offsets": np.cumsum(np.concatenate(lengths))}


def save_split(chain: MarkovChain, seed: int, split_id: int, split: str, count: int,
               dtype: np.dtype, block_bytes: int, parts: Parts, comm: Any) -> range:
    """Collective: `split`'s `count` documents cut into blocks, this rank's saved as parts;
    this rank's blocks."""
    blocks = plan_items(count, docs_per_block(chain, block_bytes, count, dtype))
    mine = rank_blocks(len(blocks), comm.rank, comm.size)
    frame.save_blocks(comm, PROG, parts, split, blocks, mine, "documents", "docs",
                      lambda i: draw_block(chain, seed, split_id, blocks[i], dtype))
    return mine


def write_split(out: str, split: str, meta: tk.TokenMeta, parts: Parts, mine: range,
                comm: Any) -> str:
    """Collective: OUT/SPLIT.h5 from every rank's parts: tokens in block order, document
    offsets shifted by their block's first token."""
    final = os.path.join(out, f"{split}.h5")
    layout = part_layout(parts, split, mine, comm)
    top = allreduce(comm, max((int(parts.load(split, i)["tokens"].max(initial=0))
                               for i in mine), default=0), op="max")

    def datasets(f: Any, n_tokens: int) -> dict[str, Any]:
        tokens, offsets = tk.create_datasets(f, meta, n_tokens,
                                             layout.totals[tk.DOC_OFFSETS], top)
        if comm.rank == 0:
            offsets[0] = 0
        return {tk.TOKENS: tokens, tk.DOC_OFFSETS: offsets}

    bar = Progress(comm, f"{split}: file", layout.totals[tk.TOKENS], "tokens", PROG)
    write_parts(final, parts, split, mine, datasets, comm, tw.WRITE_TOKENS,
                progress=bar, layout=layout, shift={tk.DOC_OFFSETS: (tk.TOKENS, 1)})
    bar.close()
    return final


def _write(args: argparse.Namespace, chain: MarkovChain, comm: Any
           ) -> tuple[list[str], float]:
    """Collective: each rank draws its blocks of documents as parts; all write each split
    from them. The paths, and the chain's entropy rate."""
    h = mk.entropy_rate(chain)
    written = []
    made_from = fingerprint(_params(chain, args),
                            {"block_bytes": frame.block_bytes(args.block_mib)})
    with Parts(args.out, "markov", made_from, comm, args.resume) as parts:
        for split_id, (split, count) in enumerate((("train", args.docs),
                                                   ("val", args.val_docs))):
            meta = _meta(chain, args, split, h)
            mine = save_split(chain, args.seed, split_id, split, count, meta.dtype,
                              frame.block_bytes(args.block_mib), parts, comm)
            written.append(write_split(args.out, split, meta, parts, mine, comm))
    return written, h


def main(argv: Sequence[str] | None = None) -> int:
    report_crashes()
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    comm = world()

    def summary(result: tuple[list[str], float], seconds: float) -> None:
        written, h = result
        tw.report_written(PROG, written)
        print(f"{PROG}: entropy rate {h:.4f} nats/token; {seconds:.2f} s on {comm.size} "
              "rank(s)", flush=True)

    return frame.run(PROG, comm, lambda: _check(args, comm),
                        lambda chain: _write(args, chain, comm), summary,
                        stall_s=args.stall_timeout)


if __name__ == "__main__":
    sys.exit(main())
