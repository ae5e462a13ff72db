"""`datasets/text.py --out DIR --files GLOB...`: text, JSON Lines or Parquet -> token files.

Text files: one document per file, or with ``--lines`` one per non-empty line
(the line end not included). JSON Lines (``.jsonl``, ``.jsonl.gz``,
``.json.gz``) and Parquet (``.parquet``): one document per record, the string
field ``--field`` (`hpcdp.data.prep.text.documents` reads each kind). Runs on one
process or under ``mpirun`` / ``srun --mpi=pmix``, in bounded blocks:

1. Every rank lists the same sorted files and cuts them into the same blocks
   (`hpcdp.data.prep.text.corpus`: byte ranges of ``--block-mib`` of line-shared
   files, every other file whole); each rank takes a contiguous, even share of them.
2. ``--tokenizer bpe``: a sample of at most about ``--bpe-sample-bytes`` of the
   training documents, the same on any number of ranks, is gathered on rank 0,
   which trains a byte-level BPE and shares it (`hpcdp.data.prep.text.passes`);
   ``--tokenizer PATH``: an existing tokenizer.json; default bytes.
3. Each rank reads, checks and tokenizes one block at a time and saves its tokens
   as a part in ``OUT/.hpcdp-prep/``; the ranks agree on the first error.
4. The blocks' document counts number the documents: document g goes to validation
   when ``floor((g+1)f) > floor(g f)`` for ``--val-fraction f``, evenly spread and the
   same on any number of ranks. Every rank writes its blocks' documents of each split
   into train.h5 and val.h5 (`hpcdp.data.prep.text.writer`), and tokenizer.json beside
   them for BPE; then the work folder is removed.

A rank holds about one block at a time (its text, documents and tokens); the parts
on disk hold the corpus's tokens until the end. A run stopped at any point (a time
limit, SIGKILL) continues from its saved blocks with the same command plus
``--resume``. Invalid UTF-8 is an error naming the file and byte offset (a bad
record: file and line, or row group and row); every error is agreed on by all
ranks before any file is written, and no existing output is replaced unless
``--overwrite``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from hpcdp import files
from hpcdp.data.format import tokens as tk
from hpcdp.data.prep import blocks as bk
from hpcdp.data.prep import frame as prep_run
from hpcdp.data.prep import stall
from hpcdp.data.prep.parts import Parts
from hpcdp.data.prep.parts import fingerprint as made_from
from hpcdp.data.prep.progress import Progress
from hpcdp.data.prep.text import documents as dc
from hpcdp.data.prep.text import passes
from hpcdp.data.prep.text import tokenizer as tz
from hpcdp.data.prep.text import writer as tw
from hpcdp.data.prep.text.corpus import Corpus, expand_files
from hpcdp.data.prep.world import check_world, raise_agreed, wait_quietly, world
from hpcdp.runtime.crash import report_crashes

PROG = "datasets/text.py"
RECIPE = "text"
MIB = 1 << 20
#: Text a BPE is trained on at most, by default: rank 0 holds it and the library's counts
#: of it, so it bounds that rank's memory whatever the corpus's size.
DEFAULT_BPE_SAMPLE_BYTES = 256 * MIB


def is_val(index: int, fraction: float) -> bool:
    """Whether global document `index` is a validation document (evenly spread)."""
    return int((index + 1) * fraction) > int(index * fraction)


# -- the steps ------------------------------------------------------------------------


def make_tokenizer(args: argparse.Namespace, corpus: Corpus, blocks: Sequence[bk.Block],
                   mine: range, parts: Parts, comm: Any) -> tz.Tokenizer:
    """Collective: the tokenizer the options ask for, the same on every rank (a trained
    BPE is kept in the work folder, so a resumed run does not train it again)."""
    if args.tokenizer == "bytes":
        return tz.byte_level()
    shared = tz.share_threads(os.environ)
    try:
        if args.tokenizer != "bpe":
            return tz.load_json(args.tokenizer, args.eod_token)
        saved = parts.load_state("tokenizer")
        if saved is not None:
            return tz.from_json(saved["json"], "tokenizer.json", args.eod_token)
    except tz.TokenizerError as exc:  # the same on every rank: each reads the same file
        raise tw.TokenPrepError(str(exc)) from None
    progress = Progress(comm, "BPE sample", corpus.total, "B", PROG)
    sample, error = passes.sample_for_bpe(corpus, blocks, mine, args.val_fraction,
                                          args.bpe_sample_bytes, comm, progress)
    text = None
    if error is None and comm.rank == 0:  # trained apart, on every CPU of this rank
        try:
            with stall.waiting("training the BPE in a child process"):
                text = tz.train_bpe_apart(sample, args.vocab_size, args.eod_token,
                                          every_cpu=shared).json
        except tz.TokenizerError as exc:
            error = str(exc)
    del sample
    wait_quietly(comm)  # the others sleep while rank 0 trains on every core
    text, error = comm.bcast((text, error), root=0)
    if error:
        raise tw.TokenPrepError(error)
    parts.save_state("tokenizer", {"json": text})
    return tz.from_json(text, "tokenizer.json", args.eod_token)


def check_counts(counts: dict[str, int], fraction: float) -> None:
    """An empty corpus or an empty split is an error (the same counts on every rank)."""
    if counts["train"] + counts["val"] == 0:
        raise tw.TokenPrepError("--files: no documents (every file or line is empty)")
    if counts["train"] == 0:
        raise tw.TokenPrepError(f"no training documents: {counts['val']} in all, and "
                                f"--val-fraction {fraction} takes them all")
    if fraction > 0 and counts["val"] == 0:
        raise tw.TokenPrepError(
            f"--val-fraction {fraction} of {counts['train']} documents is none: raise it or "
            "add documents (or pass --val-fraction 0 for no val.h5)")


def split_totals(total_docs: int, fraction: float) -> dict[str, int]:
    """Documents per split: the validation rule takes exactly ``floor(D f)`` of D."""
    val = int(total_docs * fraction) if total_docs else 0
    return {"train": total_docs - val, "val": val}


def selector(split: str, fraction: float) -> Any:
    """``select(first, lengths)``: the mask of a block's documents that `split` keeps."""
    def select(first: int, lengths: np.ndarray) -> np.ndarray:
        val = passes.val_mask(first, len(lengths), fraction)
        return val if split == "val" else ~val
    return select


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
                   help="the longest JSON Lines record, Parquet value, --lines line or "
                        "text file (one document) accepted (default: 64 MiB); see "
                        "docs/input-checks.md")
    p.add_argument("--max-expansion", type=int, default=dc.Limits.expansion,
                   help="gzip and Parquet files: at most this many times their size (at least "
                        "64 KiB) in documents (default: 100)")
    p.add_argument("--bpe-sample-bytes", type=int, default=DEFAULT_BPE_SAMPLE_BYTES,
                   metavar="N", help="a BPE is trained on at most about N bytes of the "
                   "training documents, every k-th of each block (default: 256 MiB)")
    p.add_argument("--overwrite", action="store_true", help="replace existing output files")
    prep_run.add_common_options(p)
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
    check_world(comm.size)
    if not 0 <= args.val_fraction < 1:
        raise tw.TokenPrepError(f"--val-fraction must be in [0, 1), got {args.val_fraction}")
    if args.tokenizer not in ("bytes", "bpe") and not os.path.isfile(args.tokenizer):
        raise tw.TokenPrepError(f"--tokenizer {args.tokenizer}: no such file (or use 'bytes' "
                                "or 'bpe')")
    _block_bytes(args)
    if args.bpe_sample_bytes < 1:
        raise tw.TokenPrepError(f"--bpe-sample-bytes {args.bpe_sample_bytes}: expected a "
                                "positive number of bytes")
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
    prep_run.check_outputs(args.out, _outputs(args), args.overwrite, resume=args.resume)
    return corpus


def fingerprint(args: argparse.Namespace, corpus: Corpus) -> dict[str, Any]:
    """Everything that changes the parts: the files as listed (with their sizes and times),
    the options, the block size."""
    tokenizer = (args.tokenizer if args.tokenizer in ("bytes", "bpe")
                 else tk.file_sha256(args.tokenizer))
    return made_from({"files": list(corpus.paths), "lines": args.lines, "field": args.field,
                      "val_fraction": args.val_fraction, "tokenizer": tokenizer,
                      "vocab_size": args.vocab_size, "eod_token": args.eod_token,
                      "bpe_sample_bytes": args.bpe_sample_bytes,
                      "block_bytes": corpus_block_bytes(args, corpus)}, files=corpus.paths)


def _block_bytes(args: argparse.Namespace) -> int:
    return prep_run.block_bytes(args.block_mib)


def corpus_block_bytes(args: argparse.Namespace, corpus: Corpus) -> int:
    """``--block-mib``, but small enough for `blocks.MIN_BLOCKS` blocks of the corpus, so
    that a small corpus is still shared by the ranks (the corpus's size alone decides)."""
    return min(_block_bytes(args), max(1, -(-corpus.total // bk.MIN_BLOCKS)))


def _write(args: argparse.Namespace, corpus: Corpus, comm: Any) -> tuple[list[str], str | None]:
    """Collective: tokenize this rank's blocks into parts, write the splits (and
    tokenizer.json), remove the parts; the paths written."""
    blocks = corpus.blocks(corpus_block_bytes(args, corpus))
    mine = bk.rank_blocks(len(blocks), comm.rank, comm.size)
    parts = Parts(args.out, RECIPE, fingerprint(args, corpus), comm, args.resume)
    prep_run.resume_note(comm, PROG, parts, passes.DOCS, mine)
    try:
        tok = make_tokenizer(args, corpus, blocks, mine, parts, comm)
        progress = Progress(comm, "tokenized", corpus.total, "B", PROG)
        error = passes.tokenize_blocks(corpus, blocks, mine, tok, parts, progress)
        progress.close()
        raise_agreed(comm, error, tw.TokenPrepError)
        docs = passes.block_docs(parts, mine, len(blocks), comm)
        check_counts(split_totals(int(docs.sum()), args.val_fraction), args.val_fraction)
    except tw.TokenPrepError:  # bad input: nothing written, nothing kept to resume from
        parts.remove()
        raise
    firsts = np.cumsum(docs) - docs
    written = [tw.write_split_parts(args.out, split, parts, mine, firsts,
                                    selector(split, args.val_fraction),
                                    meta_for(tok, split, args), comm)
               for split in (("train", "val") if args.val_fraction > 0 else ("train",))]
    saved = save_tokenizer(args.out, tok, comm) if _copies_tokenizer(args) else None
    parts.remove()
    return written, saved


def _summary(result: tuple[list[str], str | None], seconds: float, ranks: int) -> None:
    written, saved = result
    tw.report_written(PROG, written)
    if saved:
        print(f"{PROG}: wrote {saved}", flush=True)
    print(f"{PROG}: {seconds:.2f} s on {ranks} rank(s)", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    report_crashes()
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    comm = world()
    return prep_run.run(PROG, comm, lambda: _setup(args, comm),
                        lambda corpus: _write(args, corpus, comm),
                        lambda result, seconds: _summary(result, seconds, comm.size),
                        stall_s=args.stall_timeout)


if __name__ == "__main__":
    sys.exit(main())
