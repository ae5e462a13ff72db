"""`datasets/criteo.py`: Criteo click logs (plain or gzipped) -> OUT/train.h5, OUT/val.h5.

The files have the layout the recsys task reads (`hpcdp.data.format.clicks`):
``dense`` (N, 13) float32, ``sparse`` (N, 26) int32, ``label`` (N,) uint8, row
aligned and chunked alike, with ``table_sizes`` and ``field_names`` as
attributes, so a model is built from the prepared file alone. The parsing and
the rules are `hpcdp.data.prep.clicks.criteo`'s; this module streams the logs
through the preparation frame (`hpcdp.data.prep.frame`, `blocks`, `parts`):

1. Each split's plain files are cut into blocks of ``--block-mib`` (the same list for
   any number of ranks). A gzip file cannot be entered midway, so one rank inflates it
   a block of whole lines at a time into a chunk file of the work folder (OUT/.hpcdp-prep/),
   which any rank then parses (`criteo_schedule`: in each round every rank parses a block
   or inflates; one gzip file keeps every rank busy). A block is parsed into a part; a
   chunk is removed once parsed. A bad line stops the run with the first bad line in file
   order named on every rank, and nothing written.
2. Ids: hashed into ``--buckets`` rows a field as each block is parsed (one pass), or
   from the vocabulary of the values seen at least ``--min-count`` times in the training
   rows, counted on owner ranks (`hpcdp.data.prep.clicks.criteo_vocab`: each rank holds
   about 1/P of the distinct values), then a second pass over the parts asks the owners
   for the ids of each block's distinct values, saved beside the block's part.
3. The final files hold the blocks' rows in file and block order (prefix sums of the
   rows per block, the clicks and skipped lines tallied with each part summed in the
   same all-gather), so 1 and N ranks write the same files, each under a temporary name
   renamed when complete; nothing is replaced without ``--overwrite``.

Each line is parsed once, and no part is read again but to make its ids or to be copied.
A rank holds about one block of input and its rows (and its share of the vocabulary),
whatever the size of the logs. The cost: the rows are written twice (parts, then the
final files; with a vocabulary the ids twice too), and until the end the work folder
holds the parts (about the output's size; with a vocabulary also each block's values
and ids) and the chunks inflated but not yet parsed. A killed run continues from its
completed blocks with ``--resume`` (a gzip file inflated again up to them, unless it was
inflated whole; and from the counted vocabulary if the number of ranks is the same).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hpcdp.data.format import samples
from hpcdp.data.prep import frame
from hpcdp.data.prep.blocks import plan_blocks, rank_blocks
from hpcdp.data.prep.clicks import criteo as cr
from hpcdp.data.prep.clicks import criteo_blocks as cb
from hpcdp.data.prep.clicks import criteo_schedule as cs
from hpcdp.data.prep.clicks import criteo_vocab as cv
from hpcdp.data.prep.merge import part_layout, root_attrs
from hpcdp.data.prep.parts import Parts
from hpcdp.data.prep.progress import Progress
from hpcdp.data.prep.recipe import Recipe, Run, Split
from hpcdp.data.prep.world import PrepError

PROG = "datasets/criteo.py"
SPLITS = ("train", "val")
OPTION = {"train": "--files", "val": "--val-files"}
OUTPUTS = [f"{split}.h5" for split in SPLITS]
REFUSAL = "{first} exists; pass --overwrite to replace it (nothing was written)"
#: Bytes of one written row over the three datasets.
ROW_BYTES = cr.DENSE * 4 + cr.CATEGORICAL * 4 + 1
#: Rows copied from the parts to a final file at once.
SLAB_ROWS = 1 << 16


class CriteoPrepError(PrepError):
    """Bad input or options, agreed on by every rank: the message names the file and line."""


@dataclass(frozen=True)
class IdRule:
    """How values become ids: hashing into `buckets` rows, or a vocabulary (`min_count`)."""

    buckets: int | None
    min_count: int | None

    def describe(self) -> dict[str, Any]:
        if self.buckets is not None:
            return {"id_rule": "hash", "buckets": self.buckets}
        return {"id_rule": "vocabulary", "min_count": self.min_count}


@dataclass(frozen=True)
class Inputs:
    """The checked options: the files of each split (in order), the id rule, the block
    size and whether bad lines are skipped; the fingerprint a resume must match is these
    and the files' sizes and times (not the number of ranks)."""

    files: dict[str, list[str]]  # split -> paths
    rule: IdRule
    block_bytes: int
    skip_bad: bool


# -- reading --------------------------------------------------------------------------


def expand(patterns: Sequence[str], option: str) -> list[str]:
    """The files named: each pattern's matches sorted, in the order given; a pattern that
    matches nothing, a folder, anything but a regular file or a file named twice is an
    error."""
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
        elif not os.path.isfile(pattern):  # reading a FIFO would block, a device never end
            raise CriteoPrepError(f"{option} {pattern}: not a regular file (a FIFO, device "
                                  "or socket); refused")
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


@dataclass(frozen=True)
class Unit:
    """One block to parse: bytes ``[start, end)`` of `path`, a plain input or a chunk of a
    gzip input inflated into the work folder (whose lines are numbered from `first_line`);
    `key` is its place in the split (`criteo_schedule.key`)."""

    key: int
    path: str
    start: int
    end: int
    name: str  # the file the user gave
    first_line: int | None = None  # a chunk's first line; None: counted in the file
    input_bytes: int = 0  # of the user's file (a chunk's: of the gzip file), for the progress


def chunk_path(parts: Parts, split: str, pos: int, k: int) -> str:
    return parts.path(f"{split}-{pos:05d}-{k:010d}.txt")


def gzip_state(split: str, pos: int) -> str:
    """The state naming the chunks of a gzip file inflated to its end."""
    return f"gzip-{split}-{pos:05d}"


def part_names(split: str, inputs: Inputs) -> tuple[str, ...]:
    """The parts whose arrays are a block's rows: with hashed ids the one it is parsed into;
    with a vocabulary the one it is parsed into (its values encoded, ``SPLIT-raw``) and its
    ids, made once the vocabulary is known (``SPLIT``)."""
    return (split,) if inputs.rule.buckets is not None else (f"{split}-raw", split)


def known_units(split: str, inputs: Inputs, parts: Parts) -> tuple[dict[int, Unit], list[int]]:
    """The blocks of `split` known before reading (plain files cut into blocks, gzip files an
    earlier run inflated whole), and the positions of the gzip files left to inflate."""
    units: dict[int, Unit] = {}
    inflate: list[int] = []
    for pos, path in enumerate(inputs.files[split]):
        if cr.is_gzip(path):
            state = parts.load_state(gzip_state(split, pos))
            if state is None:
                inflate.append(pos)
                continue
            for k, (first, nbytes, read) in enumerate(state["chunks"]):
                key = cs.key(pos, k)
                units[key] = Unit(key, chunk_path(parts, split, pos, k), 0, nbytes, path, first,
                                  read)
            continue
        for block in plan_blocks([(path, os.path.getsize(path))], inputs.block_bytes):
            key = cs.key(pos, block.index)
            units[key] = Unit(key, path, block.start, block.end, path, None, block.nbytes)
    return units, inflate


@dataclass
class Round:
    """What a rank reports after its work of a round."""

    error: tuple[int, str] | None = None  # (block key, message) of a bad line or stream
    units: list[Unit] = field(default_factory=list)  # blocks inflated
    finished: int | None = None  # the gzip file inflated to its end


def parse_split(split: str, inputs: Inputs, parts: Parts, owned: cv.OwnedCounts | None,
                progress: Any, comm: Any) -> list[int]:
    """Collective: every block of `split` parsed into its part, in rounds where every rank
    parses one block or inflates the next block of a gzip file (`criteo_schedule`), with
    `owned` the values counted on their owners; the split's block keys. The first bad line
    in file order is raised on every rank."""
    units, to_inflate = known_units(split, inputs, parts)
    schedule = cs.Schedule.start(comm.size, units, to_inflate)
    inflaters: dict[int, cb.Inflater] = {}
    first: tuple[int, str] | None = None
    last_round = 0.0  # seconds the last round took
    while not schedule.finished():
        began = time.monotonic()
        job, arg = schedule.plan().get(comm.rank, ("", 0))
        report, values = Round(), None
        if job == cs.PARSE:
            values, report.error = _parse(split, units[arg], inputs, parts, owned is not None)
            progress.advance(units[arg].input_bytes)
        elif job == cs.INFLATE:  # as many blocks as fit in the last round (at least one)
            report = _inflate(split, arg, inputs, parts, inflaters, progress,
                              began + last_round)
        reports = comm.allgather(report)  # collective: every rank's news of this round
        last_round = time.monotonic() - began
        for got in reports:
            schedule.add(unit.key for unit in got.units)
            units.update((unit.key, unit) for unit in got.units)
            if got.finished is not None:
                schedule.done_inflating(got.finished)
        known = [r.error for r in reports if r.error] + ([first] if first else [])
        first = min(known) if known else None
        if first is not None:
            schedule.stop_after(first[0])
        if owned is not None:  # collective: this round's value counts to their owners
            cv.send_counts(comm, values, owned)
    for inflater in inflaters.values():
        inflater.close()
    if first is not None:
        raise CriteoPrepError(first[1])
    return sorted(units)


def _parse(split: str, unit: Unit, inputs: Inputs, parts: Parts, counting: bool
           ) -> tuple[cv.BlockValues | None, tuple[int, str] | None]:
    try:
        return parse_block(split, unit, inputs, parts, counting), None
    except cr.CriteoError as exc:
        return None, (unit.key, str(exc))


def _inflate(split: str, pos: int, inputs: Inputs, parts: Parts,
             inflaters: dict[int, cb.Inflater], progress: Any, until: float) -> Round:
    """The next blocks of gzip file `pos` inflated into chunk files (a block whose part is
    done already: only counted): one, and more while another would end nearer to time
    `until` (monotonic) than now is, up to the file's end; at its end, the file's chunks
    saved as state, for a resumed run."""
    path = inputs.files[split][pos]
    if pos not in inflaters:
        inflaters[pos] = cb.Inflater(path, inputs.block_bytes)
    inflater = inflaters[pos]
    part = part_names(split, inputs)[0]
    report = Round()
    took = 0.0  # seconds the last block took
    while not inflater.finished and (not report.units or time.monotonic() + took / 2 <= until):
        k, before, began = inflater.chunks, inflater.consumed, time.monotonic()
        key = cs.key(pos, k)
        target = chunk_path(parts, split, pos, k)
        try:
            chunk = inflater.next_chunk(None if parts.done(part, key) else target)
        except cr.CriteoError as exc:
            progress.advance(inflater.consumed - before)
            return Round(units=report.units, error=(key, str(exc)), finished=pos)
        if chunk is None:  # the end of the stream after the last chunk: counted here
            progress.advance(inflater.consumed - before)
            break
        first, nbytes, read = chunk
        report.units.append(Unit(key, target, 0, nbytes, path, first, read))
        took = time.monotonic() - began
    if inflater.finished:
        parts.save_state(gzip_state(split, pos), {"chunks": inflater.made})
        report.finished = pos
    return report


def parse_block(split: str, unit: Unit, inputs: Inputs, parts: Parts, counting: bool
                ) -> cv.BlockValues | None:
    """Block `unit` parsed into its part (hashed ids: the final part; a vocabulary: its
    values encoded (`criteo_vocab.BlockValues`), ``split-raw``), its clicks and skipped
    lines tallied with it; those values when `counting` (from the part if there). A chunk
    file goes once its part is saved."""
    vocab = inputs.rule.buckets is None
    name = part_names(split, inputs)[0]
    if parts.done(name, unit.key):
        return cv.BlockValues.from_arrays(parts.load(name, unit.key)) if counting else None
    buckets = int(inputs.rule.buckets or 0)
    dense, ids, label, skipped = [], [], [], 0
    try:
        for rows in cb.block_pieces(unit.path, unit.start, unit.end, unit.name,
                                    inputs.skip_bad, unit.first_line):  # each made small
            dense.append(cr.dense_features(rows.counts))
            ids.append(rows.values if vocab else cr.hashed_ids(rows.values, buckets))
            label.append(rows.label)
            skipped += rows.skipped
    except OSError as exc:  # reading (saving the part below is not bad input)
        raise cr.CriteoError(f"{unit.name}: cannot be read: {exc}") from None
    arrays = {"dense": _join(dense, (cr.DENSE,), np.float32),
              "label": _join(label, (), np.uint8)}
    tally = {"clicks": int(np.sum(arrays["label"], dtype=np.int64)), "skipped": skipped}
    values = None
    if vocab:  # the values field by field, the pieces let go before they are encoded
        by_field = np.concatenate([v.T for v in ids], axis=1) if ids else np.zeros(
            (cr.CATEGORICAL, 0), np.int64)
        ids.clear()
        values = cv.BlockValues.encode(by_field)
        parts.save(name, unit.key, tally, **arrays, **values.arrays())
    else:
        parts.save(name, unit.key, tally, **arrays,
                   sparse=_join(ids, (cr.CATEGORICAL,), np.int32))
    if unit.first_line is not None and os.path.exists(unit.path):
        os.remove(unit.path)  # a chunk, parsed
    return values if counting else None


def _join(pieces: list[np.ndarray], tail: tuple[int, ...], dtype: Any) -> np.ndarray:
    return np.concatenate(pieces) if pieces else np.zeros((0, *tail), dtype)


# -- the vocabulary ---------------------------------------------------------------------


def vocabulary(inputs: Inputs, parts: Parts, progress: Any, comm: Any
               ) -> tuple[dict[str, list[int]], cv.Shard]:
    """Collective: parse both splits, counting the training values on their owners; the
    block keys of each split and this rank's vocabulary shard (kept in the work folder; one
    counted by as many ranks before is read back instead)."""
    shard_path = parts.path(f"vocab-{comm.rank}-of-{comm.size}.npz")
    state = parts.load_state("vocabulary")
    counted = state is not None and state.get("ranks") == comm.size
    owned = None if counted else cv.OwnedCounts(int(inputs.rule.min_count or 1))
    keys = {split: parse_split(split, inputs, parts, owned if split == "train" else None,
                               progress, comm) for split in SPLITS}
    if counted:
        with np.load(shard_path) as saved:
            return keys, cv.Shard.from_arrays(saved)
    shard = cv.make_shard(comm, owned)  # type: ignore[arg-type]
    tmp = f"{shard_path}.tmp-{uuid.uuid4().hex[:8]}.npz"
    np.savez(tmp, **shard.arrays())
    os.replace(tmp, shard_path)
    comm.Barrier()  # every shard saved before the state says so
    if comm.rank == 0:
        parts.save_state("vocabulary", {"ranks": comm.size})
    return keys, shard


def map_split(split: str, keys: Sequence[int], inputs: Inputs, shard: cv.Shard, parts: Parts,
              comm: Any) -> None:
    """Collective: the ids of the values of each of this rank's raw parts of `split` (keys
    `keys`, rounds over ranks as `rank_blocks`) asked of their owners, one round of blocks
    at a time, and saved beside them (``SPLIT``)."""
    raw_name, ids_name = part_names(split, inputs)
    mine = [keys[i] for i in rank_blocks(len(keys), comm.rank, comm.size)]
    for k in range(-(-len(keys) // comm.size)):  # every rank's number of rounds
        key = mine[k] if k < len(mine) and not parts.done(ids_name, mine[k]) else None
        raw = parts.load(raw_name, key) if key is not None else None
        # collective: the values' ids asked of their owners, and their questions answered
        ids = cv.ask_ids(comm, cv.BlockValues.from_arrays(raw) if raw else None, shard)
        if key is not None:
            parts.save(ids_name, key, sparse=ids)


# -- writing ----------------------------------------------------------------------------


def datasets(inputs: Inputs, split: Split, f: Any, totals: dict[str, int], tally: Any
             ) -> dict[str, Any]:
    """The three row-aligned datasets, chunked alike."""
    n = totals["label"]
    chunk = samples.chunk_rows(ROW_BYTES, n)
    return {name: f.create_dataset(name, shape=(n, *tail), dtype=dtype, chunks=(chunk, *tail),
                                   fill_time="never")
            for name, tail, dtype in (("dense", (cr.DENSE,), np.float32),
                                      ("sparse", (cr.CATEGORICAL,), np.int32),
                                      ("label", (), np.uint8))}


def attributes(inputs: Inputs, split: Split, totals: dict[str, int], tally: dict[str, int]
               ) -> dict[str, Any]:
    """What a model is built from (the table sizes, `split.source`) and what was read."""
    n = totals["label"]
    schema = {"dense": {"shape": [n, cr.DENSE], "dtype": "float32"},
              "sparse": {"shape": [n, cr.CATEGORICAL], "dtype": "int32"},
              "label": {"shape": [n], "dtype": "uint8"}}
    params = {"files": inputs.files["train"], "val_files": inputs.files["val"],
              **inputs.rule.describe()}
    return root_attrs(schema, n, "criteo", split.name, params, more={
        "table_sizes": np.asarray(split.source, np.int64),
        "field_names": json.dumps(list(cr.CATEGORICAL_NAMES)),
        "dense_names": json.dumps(list(cr.DENSE_NAMES)), "dense_features": cr.DENSE,
        "dense_rule": "log(1 + max(count, 0)); empty as 0",
        "click_rate": tally.get("clicks", 0) / n, "skipped_rows": tally.get("skipped", 0),
        **inputs.rule.describe()})


def read_splits(inputs: Inputs, parts: Parts, comm: Any
                ) -> tuple[dict[str, list[int]], list[int], cv.Shard | None]:
    """Collective: both splits parsed into parts (counting the vocabulary's values); the
    block keys of each, the table sizes and this rank's vocabulary shard (hashed: None)."""
    total = sum(os.path.getsize(p) for split in SPLITS for p in inputs.files[split])
    progress = Progress(comm, "reading", total, "B", prog=PROG)
    try:
        if inputs.rule.buckets is not None:
            return ({split: parse_split(split, inputs, parts, None, progress, comm)
                     for split in SPLITS}, [inputs.rule.buckets] * cr.CATEGORICAL, None)
        keys, shard = vocabulary(inputs, parts, progress, comm)
        return keys, list(shard.table_sizes), shard
    finally:
        progress.close()


def write(run: Run) -> list[str]:
    """Collective: parse, agree, make the ids and write both splits; the paths written.
    The blocks are known only as the logs are read (a gzip file's as it is inflated)."""
    inputs, parts, comm = run.inputs, run.parts, run.comm
    keys, sizes, shard = read_splits(inputs, parts, comm)
    if shard is not None:
        for split in SPLITS:
            map_split(split, keys[split], inputs, shard, parts, comm)
    mine = {s: [keys[s][i] for i in rank_blocks(len(keys[s]), comm.rank, comm.size)]
            for s in SPLITS}
    layouts = {s: part_layout(parts, part_names(s, inputs), mine[s], comm) for s in SPLITS}
    for split in SPLITS:  # before any file is written
        if not layouts[split].totals.get("label"):
            raise CriteoPrepError(f"{OPTION[split]}: no rows "
                                  f"({', '.join(inputs.files[split])})")
    return [run.write(Split(s, keys[s], "", "", SLAB_ROWS, source=sizes,
                            parts=part_names(s, inputs)), mine[s], layouts[s].tally)
            for s in SPLITS]


# -- command line ---------------------------------------------------------------------


def options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--files", nargs="+", required=True, metavar="TRAIN",
                   help="training logs, plain or .gz (globs expanded here, each sorted)")
    p.add_argument("--val-files", nargs="+", required=True, metavar="VAL",
                   help="validation logs, plain or .gz")
    rule = p.add_mutually_exclusive_group(required=True)
    rule.add_argument("--buckets", type=int,
                      help="hash each field's values into N rows (id 0: empty)")
    rule.add_argument("--min-count", type=int,
                      help="a vocabulary of the values seen at least T times in the training "
                           "files (id 0: empty, 1: rarer or unseen)")
    p.add_argument("--skip-bad", action="store_true",
                   help="leave out bad lines and count them (default: the first is an error)")


def check(args: argparse.Namespace, comm: Any) -> Inputs:
    """Every check of the options, on this rank."""
    if args.buckets is not None and not 2 <= args.buckets < 2**31:
        raise CriteoPrepError(f"--buckets must be in [2, 2**31), got {args.buckets}")
    if args.min_count is not None and args.min_count < 1:
        raise CriteoPrepError(f"--min-count must be at least 1, got {args.min_count}")
    block_bytes = frame.block_bytes(args.block_mib)
    files = {"train": expand(args.files, "--files"),
             "val": expand(args.val_files, "--val-files")}
    both = {os.path.realpath(p) for p in files["train"]} & {
        os.path.realpath(p) for p in files["val"]}
    if both:
        raise CriteoPrepError(f"{sorted(both)[0]}: named in both --files and --val-files")
    # The folder is made here, once the options pass: a bad line found while reading then
    # leaves it there and empty (no file, no work folder), where the frame would remove a
    # folder it made itself.
    frame.check_outputs(args.out, OUTPUTS, args.overwrite, REFUSAL, resume=args.resume)
    return Inputs(files, IdRule(args.buckets, args.min_count), block_bytes, args.skip_bad)


def summary(inputs: Inputs, paths: list[str], seconds: float, ranks: int) -> None:
    import h5py

    for path in paths:
        with h5py.File(path, "r") as f:
            a = dict(f.attrs)
        skipped = f", {a['skipped_rows']} bad lines skipped" if a["skipped_rows"] else ""
        print(f"{PROG}: wrote {path}: {a['num_samples']} rows, click rate "
              f"{a['click_rate']:.3f}, {int(np.sum(a['table_sizes']))} table rows "
              f"({a['id_rule']}){skipped}", flush=True)
    print(f"{PROG}: {seconds:.2f} s on {ranks} rank(s)", flush=True)


RECIPE = Recipe(
    "criteo", "Criteo click logs (plain or .gz) -> train.h5, val.h5 for the recsys task",
    options, check, lambda inputs: OUTPUTS, lambda inputs: [], None,
    datasets, summary, attributes,
    files=lambda inputs: [p for split in SPLITS for p in inputs.files[split]], write=write,
    prog=PROG, description=__doc__.splitlines()[0], refusal=REFUSAL)


def main(argv: Sequence[str] | None = None) -> int:
    return frame.main(RECIPE, argv)


if __name__ == "__main__":
    sys.exit(main())
