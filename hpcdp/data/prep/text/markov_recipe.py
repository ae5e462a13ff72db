"""`datasets/markov.py --out DIR`: the Markov-chain corpus as token files train.h5, val.h5.

Runs on one process or under ``mpirun`` / ``srun --mpi=pmix``: each rank draws
its share of the documents (whole blocks of `markov.DOCS_PER_BLOCK`, each from
its own seed, so the corpus is the same on any number of ranks) and all write
one file per split (`hpcdp.data.prep.text.writer`). Both files carry the chain's
entropy rate as the attribute ``entropy_rate_nats``: the loss no model can beat.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from collections.abc import Sequence
from typing import Any

from hpcdp.data.format import tokens as tk
from hpcdp.data.format.samples import rank_rows
from hpcdp.data.prep import frame as prep_run
from hpcdp.data.prep.text import markov as mk
from hpcdp.data.prep.text import writer as tw
from hpcdp.runtime.crash import report_crashes

PROG = "datasets/markov.py"


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
    return p


def _chain(args: argparse.Namespace) -> mk.MarkovChain:
    if args.docs < 1 or args.val_docs < 1:
        raise tw.TokenPrepError(f"--docs and --val-docs must be at least 1, got {args.docs} "
                                f"and {args.val_docs}")
    if args.seed < 0:
        raise tw.TokenPrepError(f"--seed must be non-negative, got {args.seed}")
    try:
        return mk.random_chain(args.symbols, args.successors, args.end_prob, args.seed)
    except ValueError as exc:
        raise tw.TokenPrepError(f"--symbols/--successors/--end-prob: {exc}") from exc


def _meta(chain: mk.MarkovChain, args: argparse.Namespace, split: str, h: float
          ) -> tk.TokenMeta:
    params = {"symbols": chain.symbols, "successors": args.successors,
              "end_prob": chain.end_prob, "seed": args.seed, "docs": args.docs,
              "val_docs": args.val_docs}
    return tk.TokenMeta(vocab_size=chain.vocab_size, eod_id=chain.eod,
                        tokenizer=f"markov-{chain.symbols}",
                        tokenizer_sha256=_identity_sha(chain.symbols),
                        split=split, source="markov", source_params=params,
                        extra={"entropy_rate_nats": h})


def _identity_sha(symbols: int) -> str:
    """Markov tokens are symbol numbers; their "tokenizer" is the symbol count."""
    return hashlib.sha256(f"hpcdp markov symbols v1: {symbols} + EOD".encode()).hexdigest()


def _check(args: argparse.Namespace, comm: Any) -> mk.MarkovChain:
    """Every check of the options, on this rank; the chain they describe."""
    prep_run.check_world(comm.size)
    chain = _chain(args)
    prep_run.check_outputs(args.out, ["train.h5", "val.h5"], args.overwrite)
    return chain


def _write(args: argparse.Namespace, chain: mk.MarkovChain, comm: Any
           ) -> tuple[list[str], float]:
    """Collective: each rank draws its blocks of documents; all write each split. The
    paths, and the chain's entropy rate."""
    h = mk.entropy_rate(chain)
    written = []
    for split_id, (split, count) in enumerate((("train", args.docs), ("val", args.val_docs))):
        lo, hi = rank_rows(count, mk.DOCS_PER_BLOCK, comm.rank, comm.size)
        docs = mk.sample_documents(chain, args.seed, split_id, lo, hi)
        written.append(tw.write_split(args.out, split, docs, _meta(chain, args, split, h), comm))
    return written, h


def main(argv: Sequence[str] | None = None) -> int:
    report_crashes()
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    comm = prep_run.world()

    def summary(result: tuple[list[str], float], seconds: float) -> None:
        written, h = result
        tw.report_written(PROG, written)
        print(f"{PROG}: entropy rate {h:.4f} nats/token; {seconds:.2f} s on {comm.size} "
              "rank(s)", flush=True)

    return prep_run.run(PROG, comm, lambda: _check(args, comm),
                        lambda chain: _write(args, chain, comm), summary)


if __name__ == "__main__":
    sys.exit(main())
