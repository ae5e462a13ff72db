"""`datasets/markov.py --out DIR`: the Markov-chain corpus as token files train.h5, val.h5.

Runs on one process or under ``mpirun`` / ``srun --mpi=pmix``: each rank draws
its share of the documents (whole blocks of `markov.DOCS_PER_BLOCK`, each from
its own seed, so the corpus is the same on any number of ranks) and all write
one file per split (`hpcdp.data.token_writer`). Both files carry the chain's
entropy rate as the attribute ``entropy_rate_nats``: the loss no model can beat.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from collections.abc import Sequence

from hpcdp.data import markov as mk
from hpcdp.data import token_writer as tw
from hpcdp.data import tokens as tk
from hpcdp.data.prep import rank_rows

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


def _check(args: argparse.Namespace) -> mk.MarkovChain:
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


def main(argv: Sequence[str] | None = None) -> int:
    tw.crash_stacks()
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    comm = tw.world()
    error = None
    try:
        tw.check_world(comm)
        chain = _check(args)
        tw.check_outputs(args.out, ["train.h5", "val.h5"], args.overwrite)
    except (tw.TokenPrepError, OSError, ImportError) as exc:
        error = str(exc)
    error = tw.agree(comm, error)
    if error:
        tw.say(comm, PROG, f"error: {error}")
        return 1
    start = time.perf_counter()
    h = mk.entropy_rate(chain)
    written = []
    try:
        for split_id, (split, count) in enumerate((("train", args.docs), ("val", args.val_docs))):
            lo, hi = rank_rows(count, mk.DOCS_PER_BLOCK, comm.rank, comm.size)
            docs = mk.sample_documents(chain, args.seed, split_id, lo, hi)
            written.append(tw.write_split(args.out, split, docs, _meta(chain, args, split, h),
                                          comm))
    except Exception as exc:  # noqa: BLE001 - a rank failing mid-write must not hang the others
        tw.say(comm, PROG, f"error while writing: {type(exc).__name__}: {exc}")
        if comm.size > 1:
            comm.Abort(1)
        return 1
    if comm.rank == 0:
        for path in written:
            info = tk.validate_tokens(path)
            print(f"{PROG}: wrote {path}: {info.num_documents} documents, {info.num_tokens} "
                  f"tokens", flush=True)
        print(f"{PROG}: entropy rate {h:.4f} nats/token; {time.perf_counter() - start:.2f} s "
              f"on {comm.size} rank(s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
