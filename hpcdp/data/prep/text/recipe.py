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
   into train.h5 and val.h5 through the one merge (`hpcdp.data.prep.text.writer`), and
   tokenizer.json beside them for BPE; then the work folder is removed.

The recipe is `RECIPE`, run by `frame.main` (the ranks, the common options, the output
checks, the fingerprint of `Inputs`, the exit statuses); steps 2-4 are its `write` hook.

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
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hpcdp import files
from hpcdp.data.format import tokens as tk
from hpcdp.data.prep import blocks as bk
from hpcdp.data.prep import frame, stall
from hpcdp.data.prep.merge import part_layout
from hpcdp.data.prep.progress import Progress
from hpcdp.data.prep.recipe import SAME_BYTES, Recipe, Run
from hpcdp.data.prep.text import documents as dc
from hpcdp.data.prep.text import passes
from hpcdp.data.prep.text import tokenizer as tz
from hpcdp.data.prep.text import writer as tw
from hpcdp.data.prep.text.corpus import Corpus, expand_files
from hpcdp.data.prep.world import raise_agreed, wait_quietly

PROG = "datasets/text.py"
#: Text a BPE is trained on at most, by default: rank 0 holds it and the library's counts
#: of it, so it bounds that rank's memory whatever the corpus's size.
DEFAULT_BPE_SAMPLE_BYTES = 256 << 20


@dataclass(frozen=True)
class Inputs:
    """The checked options: those the parts are made from (with the files' sizes and times,
    what a resumed run must share), then what follows from them or changes no part."""

    files: list[str]  # the corpus's files, expanded and sorted
    lines: bool
    field: str
    val_fraction: float
    tokenizer: str  # bytes, bpe, or the SHA-256 of the given tokenizer.json
    vocab_size: int
    eod_token: str
    bpe_sample_bytes: int
    block_bytes: int  # --block-mib, small enough for `blocks.MIN_BLOCKS` blocks
    corpus: Corpus = field(metadata=SAME_BYTES)
    params: dict[str, Any] = field(metadata=SAME_BYTES)  # the files' source_params
    tokenizer_path: str = field(metadata=SAME_BYTES)  # --tokenizer as given
    copies_tokenizer: bool = field(metadata=SAME_BYTES)  # tokenizer.json written in --out


def is_val(index: int, fraction: float) -> bool:
    """Whether global document `index` is a validation document (evenly spread)."""
    return int((index + 1) * fraction) > int(index * fraction)


# -- the steps ------------------------------------------------------------------------


def make_tokenizer(inputs: Inputs, blocks: Sequence[bk.Block], mine: range, parts: Any,
                   comm: Any) -> tz.Tokenizer:
    """Collective: the tokenizer the options ask for, the same on every rank (a trained
    BPE is kept in the work folder, so a resumed run does not train it again)."""
    if inputs.tokenizer == "bytes":
        return tz.byte_level()
    shared = tz.share_threads(os.environ)
    try:
        if inputs.tokenizer != "bpe":
            return tz.load_json(inputs.tokenizer_path, inputs.eod_token)
        saved = parts.load_state("tokenizer")
        if saved is not None:
            return tz.from_json(saved["json"], "tokenizer.json", inputs.eod_token)
    except tz.TokenizerError as exc:  # the same on every rank: each reads the same file
        raise tw.TokenPrepError(str(exc)) from None
    progress = Progress(comm, "BPE sample", inputs.corpus.total, "B", PROG)
    sample, error = passes.sample_for_bpe(inputs.corpus, blocks, mine, inputs.val_fraction,
                                          inputs.bpe_sample_bytes, comm, progress)
    text = None
    if error is None and comm.rank == 0:  # trained apart, on every CPU of this rank
        try:
            with stall.waiting("training the BPE in a child process"):
                text = tz.train_bpe_apart(sample, inputs.vocab_size, inputs.eod_token,
                                          every_cpu=shared).json
        except tz.TokenizerError as exc:
            error = str(exc)
    del sample
    wait_quietly(comm)  # the others sleep while rank 0 trains on every core
    text, error = comm.bcast((text, error), root=0)
    if error:
        raise tw.TokenPrepError(error)
    parts.save_state("tokenizer", {"json": text})
    return tz.from_json(text, "tokenizer.json", inputs.eod_token)


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


def meta_for(tok: tz.Tokenizer, split: str, inputs: Inputs) -> tk.TokenMeta:
    return tk.TokenMeta(tok.vocab_size, tok.eod_id, tok.name, tok.sha256, split, "text",
                        inputs.params)


def save_tokenizer(out: str, tok: tz.Tokenizer, comm: Any) -> str | None:
    """Rank 0 writes tokenizer.json beside the data (temporary name, then rename)."""
    if tok.json is None:
        return None
    final = os.path.join(out, "tokenizer.json")
    if comm.rank == 0:
        files.write_atomic(final, tok.json)
    return final


# -- command line ---------------------------------------------------------------------


def _options(p: argparse.ArgumentParser) -> None:
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


def _copies_tokenizer(args: argparse.Namespace) -> bool:
    """Whether tokenizer.json is written beside the data (not when it is already there)."""
    target = os.path.join(args.out, "tokenizer.json")
    if args.tokenizer == "bytes":
        return False
    return args.tokenizer == "bpe" or not (os.path.exists(target)
                                           and os.path.samefile(args.tokenizer, target))


def _outputs(inputs: Inputs) -> list[str]:
    names = ["train.h5"] + (["val.h5"] if inputs.val_fraction > 0 else [])
    return names + (["tokenizer.json"] if inputs.copies_tokenizer else [])


def _corpus(args: argparse.Namespace) -> Corpus:
    """The corpus the options name, its record limits checked first."""
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
    return corpus


def check(args: argparse.Namespace, comm: Any) -> Inputs:
    """Every check of the options, on this rank; the corpus they name."""
    if not 0 <= args.val_fraction < 1:
        raise tw.TokenPrepError(f"--val-fraction must be in [0, 1), got {args.val_fraction}")
    if args.tokenizer not in ("bytes", "bpe") and not os.path.isfile(args.tokenizer):
        raise tw.TokenPrepError(f"--tokenizer {args.tokenizer}: no such file (or use 'bytes' "
                                "or 'bpe')")
    block = frame.block_bytes(args.block_mib)
    if args.bpe_sample_bytes < 1:
        raise tw.TokenPrepError(f"--bpe-sample-bytes {args.bpe_sample_bytes}: expected a "
                                "positive number of bytes")
    corpus = _corpus(args)
    tokenizer = (args.tokenizer if args.tokenizer in ("bytes", "bpe")
                 else tk.file_sha256(args.tokenizer))
    params = {"files": args.files, "lines": args.lines, "field": args.field,
              "val_fraction": args.val_fraction, "tokenizer": args.tokenizer}
    # Small enough for MIN_BLOCKS blocks, so that ranks share a small corpus too.
    block = min(block, max(1, -(-corpus.total // bk.MIN_BLOCKS)))
    return Inputs(list(corpus.paths), args.lines, args.field, args.val_fraction, tokenizer,
                  args.vocab_size, args.eod_token, args.bpe_sample_bytes, block, corpus,
                  params, args.tokenizer, _copies_tokenizer(args))


def write(run: Run) -> tuple[list[str], str | None]:
    """Collective: tokenize this rank's blocks into parts, then write the splits (and
    tokenizer.json); the paths written."""
    inputs, parts, comm = run.inputs, run.parts, run.comm
    blocks = inputs.corpus.blocks(inputs.block_bytes)
    mine = bk.rank_blocks(len(blocks), comm.rank, comm.size)
    frame.resume_note(comm, PROG, parts, passes.DOCS, mine)
    tok = make_tokenizer(inputs, blocks, mine, parts, comm)
    progress = Progress(comm, "tokenized", inputs.corpus.total, "B", PROG)
    error = passes.tokenize_blocks(inputs.corpus, blocks, mine, tok, parts, progress)
    progress.close()
    raise_agreed(comm, error, tw.TokenPrepError)
    layout = part_layout(parts, passes.DOCS, mine, comm)  # each block's first document
    total = layout.totals.get("lengths", 0)
    check_counts(split_totals(total, inputs.val_fraction), inputs.val_fraction)
    firsts = np.array([layout.starts[b]["lengths"] for b in range(len(blocks))], np.int64)
    written = [tw.write_split_parts(run.out, split, parts, mine, firsts,
                                    selector(split, inputs.val_fraction),
                                    meta_for(tok, split, inputs), comm)
               for split in (("train", "val") if inputs.val_fraction > 0 else ("train",))]
    saved = save_tokenizer(run.out, tok, comm) if inputs.copies_tokenizer else None
    return written, saved


def summary(inputs: Inputs, result: tuple[list[str], str | None], seconds: float,
            ranks: int) -> None:
    written, saved = result
    tw.report_written(PROG, written)
    if saved:
        print(f"{PROG}: wrote {saved}", flush=True)
    print(f"{PROG}: {seconds:.2f} s on {ranks} rank(s)", flush=True)


RECIPE = Recipe(
    "text", "text, JSON Lines or Parquet corpora -> token files (bytes, BPE, tokenizer.json)",
    _options, check, _outputs, lambda inputs: [], None, None, summary,
    files=lambda inputs: inputs.files, write=write, prog=PROG,
    description=__doc__.splitlines()[0])


def main(argv: Sequence[str] | None = None) -> int:
    return frame.main(RECIPE, argv)


if __name__ == "__main__":
    sys.exit(main())
