"""`datasets/criteo.py`: Criteo click logs (plain or gzipped) -> OUT/train.h5, OUT/val.h5.

The files have the layout the recsys task reads (`hpcdp.data.format.clicks`):
``dense`` (N, 13) float32, ``sparse`` (N, 26) int32, ``label`` (N,) uint8, row
aligned and chunked alike, with ``table_sizes`` and ``field_names`` as
attributes, so a model is built from the prepared file alone. The parsing and
the rules are `hpcdp.data.prep.clicks.criteo`'s; this module spreads the reading
over the ranks and writes.

Runs on one process or under ``mpirun`` / ``srun --mpi=pmix``:

1. Each split's files are laid end to end; each rank reads the lines that start
   in its contiguous byte range of them. A gzip file cannot be entered midway,
   so the rank whose range holds its first byte reads it whole.
2. Every rank parses its rows of both splits; the ranks agree on the first bad
   line (file and line) before any file is created, or with ``--skip-bad``
   count what they left out.
3. Ids: hashed into ``--buckets`` rows a field, or from the vocabulary of the
   values seen at least ``--min-count`` times in the training rows of every
   rank (their counts all-gathered and summed; every rank builds the same).
4. The rows of rank r follow those of ranks < r (exclusive prefix sums), so
   1 and N ranks write the same files, each under a temporary name renamed when
   complete; nothing is replaced without ``--overwrite``.

Each rank holds its parsed rows in memory until the write (about 320 bytes a
row): use more ranks for logs larger than that.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hpcdp import __version__
from hpcdp.data.format import samples
from hpcdp.data.prep import frame as prep_run
from hpcdp.data.prep.clicks import criteo as cr
from hpcdp.data.prep.frame import PrepError
from hpcdp.runtime.crash import report_crashes

PROG = "datasets/criteo.py"
SPLITS = ("train", "val")
#: Bytes of one written row over the three datasets.
ROW_BYTES = cr.DENSE * 4 + cr.CATEGORICAL * 4 + 1


class CriteoPrepError(PrepError):
    """Bad input or options, agreed on by every rank: the message names the file and line."""


# -- pure layout ----------------------------------------------------------------------


def byte_range(total: int, rank: int, size: int) -> tuple[int, int]:
    """Rank `rank`'s share ``[lo, hi)`` of `total` bytes."""
    return rank * total // size, (rank + 1) * total // size


def rank_pieces(paths: Sequence[str], sizes: Sequence[int], rank: int, size: int
                ) -> list[tuple[int, int, int]]:
    """(file, lo, hi) byte ranges rank `rank` reads, in file order: the part of each plain
    file in its share, and whole each gzip file whose first byte is in its share."""
    total = sum(sizes)
    lo, hi = byte_range(total, rank, size)
    pieces, start = [], 0
    for i, (path, n) in enumerate(zip(paths, sizes)):
        if cr.is_gzip(path):
            if n and lo <= start < hi:
                pieces.append((i, 0, n))
        else:
            a, b = max(lo, start) - start, min(hi, start + n) - start
            if a < b:
                pieces.append((i, a, b))
        start += n
    return pieces


@dataclass(frozen=True)
class IdRule:
    """How values become ids: hashing into `buckets` rows, or a vocabulary (`min_count`)."""

    buckets: int | None
    min_count: int | None

    def describe(self) -> dict[str, Any]:
        if self.buckets is not None:
            return {"id_rule": "hash", "buckets": self.buckets}
        return {"id_rule": "vocabulary", "min_count": self.min_count}


# -- reading --------------------------------------------------------------------------


def expand(patterns: Sequence[str], option: str) -> list[str]:
    """The files named: each pattern's matches sorted, in the order given; a pattern that
    matches nothing, a folder or a file named twice is an error."""
    paths: list[str] = []
    for pattern in patterns:
        if glob.has_magic(pattern):
            hits = sorted(h for h in glob.glob(pattern) if os.path.isfile(h))
            if not hits:
                raise CriteoPrepError(f"{option} {pattern}: matches no file")
        elif os.path.isdir(pattern):
            raise CriteoPrepError(f"{option} {pattern}: is a folder, not a click log")
        elif not os.path.exists(pattern):
            raise CriteoPrepError(f"{option} {pattern}: no such file")
        else:
            hits = [pattern]
        paths += hits
    seen: set[str] = set()
    for path in paths:
        real = os.path.realpath(path)
        if real in seen:
            raise CriteoPrepError(f"{option}: {path} is named twice")
        seen.add(real)
    return paths


def read_share(paths: Sequence[str], rank: int, size: int, skip_bad: bool) -> cr.Rows:
    """This rank's parsed rows of the files `paths`, in file and line order."""
    sizes = [os.path.getsize(p) for p in paths]
    parts = []
    for file, lo, hi in rank_pieces(paths, sizes, rank, size):
        path = paths[file]
        blocks = cr.gzip_lines(path) if cr.is_gzip(path) else cr.range_lines(path, lo, hi)
        for first, lines in blocks:
            parts.append(cr.parse_lines(lines, path, first, skip_bad))
    return cr.Rows.concat(parts)


# -- the steps ------------------------------------------------------------------------


@dataclass(frozen=True)
class Inputs:
    files: dict[str, list[str]]  # split -> paths
    rule: IdRule


def read_splits(inputs: Inputs, skip_bad: bool, comm: Any) -> dict[str, cr.Rows]:
    """Collective: this rank's rows of each split; the first bad line (in rank order, so in
    file order) raised on every rank; an empty split an error on every rank."""
    rows: dict[str, cr.Rows] = {}
    error = None
    for split in SPLITS:
        try:
            rows[split] = read_share(inputs.files[split], comm.rank, comm.size, skip_bad)
        except cr.CriteoError as exc:
            error = error or str(exc)
        except OSError as exc:
            error = error or f"cannot read the {split} files: {exc}"
    prep_run.raise_agreed(comm, error, CriteoPrepError)
    for split in SPLITS:
        if prep_run.allreduce(comm, len(rows[split].label)) == 0:
            option = "--files" if split == "train" else "--val-files"
            raise CriteoPrepError(f"{option}: no rows ({', '.join(inputs.files[split])})")
    return rows


def id_maker(rule: IdRule, train: cr.Rows, comm: Any) -> tuple[list[int], Any]:
    """Collective: the table sizes and a function from raw values to ids, alike on every rank."""
    if rule.buckets is not None:
        buckets = rule.buckets
        return [buckets] * cr.CATEGORICAL, lambda values: cr.hashed_ids(values, buckets)
    counts = cr.merge_counts(comm.allgather(cr.value_counts(train.values)))
    vocab = cr.Vocabulary.from_counts(counts, int(rule.min_count or 1))
    return vocab.table_sizes(), vocab.ids


def split_attrs(split: str, n: int, sizes: list[int], inputs: Inputs, skipped: int,
                clicks: int) -> dict[str, Any]:
    schema = {"dense": {"shape": [n, cr.DENSE], "dtype": "float32"},
              "sparse": {"shape": [n, cr.CATEGORICAL], "dtype": "int32"},
              "label": {"shape": [n], "dtype": "uint8"}}
    params = {"files": inputs.files["train"], "val_files": inputs.files["val"],
              **inputs.rule.describe()}
    return {"schema": json.dumps(schema), "num_samples": n, "source": "criteo", "split": split,
            "source_params": json.dumps(params, sort_keys=True), "hpcdp_version": __version__,
            "table_sizes": np.asarray(sizes, np.int64),
            "field_names": json.dumps(list(cr.CATEGORICAL_NAMES)),
            "dense_names": json.dumps(list(cr.DENSE_NAMES)), "dense_features": cr.DENSE,
            "dense_rule": "log(1 + max(count, 0)); empty as 0",
            "click_rate": clicks / n, "skipped_rows": skipped, **inputs.rule.describe()}


def write_split(out: str, split: str, rows: cr.Rows, ids: np.ndarray, attrs_of: Any,
                comm: Any) -> str:
    """Collective: OUT/SPLIT.h5 from every rank's rows, in rank order; its path."""
    final = os.path.join(out, f"{split}.h5")
    n_local = len(rows.label)
    start, n = prep_run.exscan(comm, n_local), prep_run.allreduce(comm, n_local)
    clicks = prep_run.allreduce(comm, int(rows.label.sum()))
    skipped = prep_run.allreduce(comm, rows.skipped)
    chunk = samples.chunk_rows(ROW_BYTES, n)
    data = {"dense": cr.dense_features(rows.counts), "sparse": ids, "label": rows.label}
    with prep_run.replacing(final, comm) as tmp, prep_run.create_h5(tmp, comm) as f:
        dsets = {name: f.create_dataset(name, shape=(n, *a.shape[1:]), dtype=a.dtype,
                                        chunks=(chunk, *a.shape[1:]), fill_time="never")
                 for name, a in data.items()}
        for key, value in attrs_of(split, n, skipped, clicks).items():
            f.attrs[key] = value
        for name, array in data.items():
            if n_local:
                dsets[name][start : start + n_local] = array
    return final


def write(args: argparse.Namespace, inputs: Inputs, comm: Any) -> list[str]:
    """Collective: read, agree, make the ids and write both splits; the paths written."""
    rows = read_splits(inputs, args.skip_bad, comm)
    sizes, to_ids = id_maker(inputs.rule, rows["train"], comm)
    written = []
    for split in SPLITS:
        written.append(write_split(
            args.out, split, rows[split], to_ids(rows[split].values),
            lambda s, n, skipped, clicks: split_attrs(s, n, sizes, inputs, skipped, clicks),
            comm))
    return written


# -- command line ---------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("--files", nargs="+", required=True, metavar="TRAIN",
                   help="training logs, plain or .gz (globs expanded here, each sorted)")
    p.add_argument("--val-files", nargs="+", required=True, metavar="VAL",
                   help="validation logs, plain or .gz")
    p.add_argument("--out", required=True, help="output folder (train.h5, val.h5)")
    rule = p.add_mutually_exclusive_group(required=True)
    rule.add_argument("--buckets", type=int,
                      help="hash each field's values into N rows (id 0: empty)")
    rule.add_argument("--min-count", type=int,
                      help="a vocabulary of the values seen at least T times in the training "
                           "files (id 0: empty, 1: rarer or unseen)")
    p.add_argument("--skip-bad", action="store_true",
                   help="leave out bad lines and count them (default: the first is an error)")
    p.add_argument("--overwrite", action="store_true", help="replace existing outputs")
    return p


def check(args: argparse.Namespace, comm: Any) -> Inputs:
    """Every check of the options, on this rank."""
    prep_run.check_world(comm.size)
    if args.buckets is not None and not 2 <= args.buckets < 2**31:
        raise CriteoPrepError(f"--buckets must be in [2, 2**31), got {args.buckets}")
    if args.min_count is not None and args.min_count < 1:
        raise CriteoPrepError(f"--min-count must be at least 1, got {args.min_count}")
    files = {"train": expand(args.files, "--files"),
             "val": expand(args.val_files, "--val-files")}
    both = {os.path.realpath(p) for p in files["train"]} & {
        os.path.realpath(p) for p in files["val"]}
    if both:
        raise CriteoPrepError(f"{sorted(both)[0]}: named in both --files and --val-files")
    prep_run.check_outputs(args.out, [f"{s}.h5" for s in SPLITS], args.overwrite,
                           refusal="{first} exists; pass --overwrite to replace it (nothing "
                                   "was written)")
    return Inputs(files, IdRule(args.buckets, args.min_count))


def summary(paths: list[str], seconds: float, ranks: int) -> None:
    import h5py

    for path in paths:
        with h5py.File(path, "r") as f:
            a = dict(f.attrs)
        skipped = f", {a['skipped_rows']} bad lines skipped" if a["skipped_rows"] else ""
        print(f"{PROG}: wrote {path}: {a['num_samples']} rows, click rate "
              f"{a['click_rate']:.3f}, {int(np.sum(a['table_sizes']))} table rows "
              f"({a['id_rule']}){skipped}", flush=True)
    print(f"{PROG}: {seconds:.2f} s on {ranks} rank(s)", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    report_crashes()
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    comm = prep_run.world()
    return prep_run.run(PROG, comm, lambda: check(args, comm),
                        lambda inputs: write(args, inputs, comm),
                        lambda written, seconds: summary(written, seconds, comm.size))


if __name__ == "__main__":
    sys.exit(main())
