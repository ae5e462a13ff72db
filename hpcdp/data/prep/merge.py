"""The final files, made from the per-block parts (`parts`) in block order.

Each block's rows are all-gathered and its first row in the file is their prefix sum in
the order of the blocks' keys (`part_layout`; any increasing integers, not only 0..n-1),
so the file is the same for any number of ranks; every rank copies its
own blocks to their rows through MPI-IO, a bounded slab at a time (`write_parts`). A file
is written under a temporary name renamed once every rank is done (`replacing`), so a
failed run never replaces a good file. `root_attrs` is what every prepared file says of
itself.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hpcdp import __version__
from hpcdp.data.prep import stall
from hpcdp.data.prep.parts import Parts
from hpcdp.data.prep.progress import Progress
from hpcdp.data.prep.world import allreduce


@dataclass(frozen=True)
class PartLayout:
    """Where every block's arrays go in a split's file: the same on every rank."""

    starts: dict[int, dict[str, int]]  # block key -> array -> its first row in the file
    totals: dict[str, int]  # array -> rows in the file
    tally: dict[str, int] = field(default_factory=dict)  # the parts' tallies, summed


def root_attrs(schema: dict[str, Any], num_samples: int, source: str, split: str,
               params: dict[str, Any], seed: int | None = None,
               more: dict[str, Any] | None = None) -> dict[str, Any]:
    """The root attributes of a prepared file, in this order: what it holds (`schema`: each
    dataset's shape and dtype), its rows, the recipe (`source`) and split, the seed where
    the recipe has one, what it was made from (`params`, as ``source_params``) and hpcdp's
    version; then the recipe's own (`more`)."""
    attrs: dict[str, Any] = {"schema": json.dumps(schema), "num_samples": num_samples,
                             "source": source, "split": split}
    if seed is not None:
        attrs["seed"] = seed
    return {**attrs, "source_params": json.dumps(params, sort_keys=True),
            "hpcdp_version": __version__, **(more or {})}


def _names(split: str | Sequence[str]) -> tuple[str, ...]:
    return (split,) if isinstance(split, str) else tuple(split)


def _lengths(parts: Parts, names: tuple[str, ...], key: int) -> dict[str, int]:
    return {k: n for name in names for k, n in parts.lengths(name, key).items()}


def part_layout(parts: Parts, split: str | Sequence[str], blocks: Sequence[int], comm: Any
                ) -> PartLayout:
    """Collective: each array's rows per block all-gathered, their prefix sums in the order
    of the block keys (so the same file on any number of ranks), the totals, and the sums of
    the counts the parts were saved with (`Parts.save`'s tally). `split` may name several
    parts of each block whose arrays together are its rows (rows parsed first, ids made
    later); `blocks` are this rank's keys."""
    names = _names(split)
    mine = [(i, _lengths(parts, names, i), [parts.tally(name, i) for name in names])
            for i in blocks]
    every = sorted((kv for got in comm.allgather(mine) for kv in got), key=lambda kv: kv[0])
    if len({i for i, _, _ in every}) != len(every):
        raise RuntimeError(f"{split}: a block is held by two ranks")
    arrays = list(every[0][1]) if every else []
    starts: dict[int, dict[str, int]] = {}
    at, tally = dict.fromkeys(arrays, 0), {}
    for i, lengths, tallies in every:
        starts[i] = dict(at)
        for name in arrays:
            at[name] += lengths[name]
        for counts in tallies:
            for name, n in counts.items():
                tally[name] = tally.get(name, 0) + n
    return PartLayout(starts, at, tally)


def write_parts(path: str, parts: Parts, split: str | Sequence[str], blocks: Sequence[int],
                datasets: Callable[[Any, int], dict[str, Any]], comm: Any, slab_rows: int,
                serial: bool = False, progress: Progress | None = None,
                layout: PartLayout | None = None,
                shift: dict[str, tuple[str, int]] | None = None,
                collective: bool = False, by_array: bool = False) -> int:
    """Collective: ``path`` from every rank's parts of `split` (this rank's: `blocks`, their
    keys), the blocks' rows in key order; the total rows (of the parts' first array).

    Rows per block are all-gathered and each block's first row is their prefix sum
    (`part_layout`, or `layout` when the recipe made it first to size its datasets), so the
    file is the same for any number of ranks. ``datasets(f, total_rows)`` creates the
    datasets (and attributes) in the new file, each filled from the part array of its name
    (arrays of other names stay in the parts); each rank copies its blocks to their rows in
    slabs of at most `slab_rows`, every rank making the same number of writes. `shift`
    maps an array to (another array, rows left above it): its values are offsets into the
    other (document ends into tokens) and get that array's start in the block added, and
    its rows start that many rows lower (a leading 0 the callback writes). With `serial`
    (filtered datasets, which parallel HDF5 cannot write reliably) rank 0 opens the file
    alone and copies every rank's parts. With `by_array`, each array of a block is copied
    whole before the next (on one rank the chunks are laid out in that order). The file
    is written under a temporary name and renamed when complete (`replacing`).
    """
    layout = layout or part_layout(parts, split, blocks, comm)
    shift = shift or {}
    first = next(iter(layout.totals), "")
    with replacing(path, comm) as tmp:
        if comm.size == 1 or serial:
            if comm.rank == 0:
                import h5py

                with h5py.File(tmp, "w") as f:
                    dsets = datasets(f, layout.totals.get(first, 0))
                    for read in _slabs(parts, split, sorted(layout.starts), slab_rows,
                                       dsets, by_array):
                        _put(dsets, read, layout, shift, progress, first, None)
        else:
            with create_h5(tmp, comm) as f:
                dsets = datasets(f, layout.totals.get(first, 0))
                mine = list(_slabs(parts, split, blocks, slab_rows, dsets, by_array))
                rounds = allreduce(comm, len(mine), op="max")
                for k in range(rounds):  # every rank writes every round, some nothing
                    read = mine[k] if k < len(mine) else None
                    _put(dsets, read, layout, shift, progress, first, collective)
    return layout.totals.get(first, 0)


def _slabs(parts: Parts, split: str | Sequence[str], blocks: Sequence[int], slab_rows: int,
           written: Iterable[str] | None = None, by_array: bool = False
           ) -> Iterator[Callable[[], tuple[int, int, dict[str, Any]]]]:
    """For each slab of `blocks`' parts, a function reading it: (block, first row in the
    block, {array: its rows of the slab}), of the arrays `written` alone (None: all), every
    one at once or, with `by_array`, one after another; the slabs are counted before
    anything is read."""
    names = _names(split)
    wanted = None if written is None else set(written)
    for i in blocks:
        lengths = _lengths(parts, names, i)
        keep = [k for k in lengths if wanted is None or k in wanted]
        for group in ([[k] for k in keep] if by_array else [keep]):
            n = max((lengths[k] for k in group), default=0)
            for a in range(0, n, max(1, slab_rows)):

                def read(i: int = i, a: int = a, group: list[str] = group
                         ) -> tuple[int, int, dict[str, np.ndarray]]:
                    part = {k: v for name in names for k, v in parts.load(name, i).items()
                            if k in group}
                    return i, a, {k: np.asarray(v[a : a + slab_rows]) for k, v in part.items()}

                yield read


def _put(dsets: dict[str, Any], read: Callable[[], Any] | None, layout: PartLayout,
         shift: dict[str, tuple[str, int]], progress: Progress | None, first: str,
         collective: bool | None) -> None:
    """One slab into every dataset: plain writes (`collective` None) or one MPI-IO write per
    dataset, empty when `read` is None (this rank has no slab left this round)."""
    block, a, data = read() if read is not None else (0, 0, {})
    for name, dset in dsets.items():
        rows = data.get(name, np.zeros((0, *dset.shape[1:]), dset.dtype))
        at = layout.starts[block][name] + a if data else 0
        if name in shift and data:
            base, skip = shift[name]
            rows = rows + layout.starts[block][base]
            at += skip
        if collective is None:
            if len(rows):
                dset[at : at + len(rows)] = rows
        else:
            mpio_write(dset, at, rows, collective)
    stall.mark()
    if progress is not None and first in data:
        progress.advance(len(data[first]))


@contextmanager
def replacing(final: str, comm: Any) -> Iterator[str]:
    """Collective: a temporary name beside `final` that every rank writes to; once all
    are done, rank 0 renames it over `final`, so a failed write never replaces a good
    file. On a failure one rank removes it; with several the job is aborted and a stale
    temporary may remain."""
    folder, name = os.path.split(final)
    token = comm.bcast(uuid.uuid4().hex[:12] if comm.rank == 0 else None, root=0)
    tmp = os.path.join(folder, f".{name}.tmp-{token}")
    try:
        yield tmp
    except BaseException:
        if comm.size == 1 and os.path.exists(tmp):
            os.remove(tmp)
        raise
    comm.Barrier()
    if comm.rank == 0:
        os.replace(tmp, final)
    comm.Barrier()


def create_h5(path: str, comm: Any) -> Any:
    """Collective: a new HDF5 file, through MPI-IO (driver ``mpio``) when there are several
    ranks."""
    import h5py

    if comm.size == 1:
        return h5py.File(path, "w")
    return h5py.File(path, "w", driver="mpio", comm=stall.raw(comm))


def mpio_write(dset: Any, start: int, data: np.ndarray, collective: bool) -> None:
    """Write rows ``[start, start+len(data))``; every rank calls, zero rows included."""
    from h5py import h5fd, h5p, h5s

    dxpl = h5p.create(h5p.DATASET_XFER)
    dxpl.set_dxpl_mpio(h5fd.MPIO_COLLECTIVE if collective else h5fd.MPIO_INDEPENDENT)
    fspace = dset.id.get_space()
    tail = tuple(dset.shape[1:])
    if len(data):
        fspace.select_hyperslab((start,) + (0,) * len(tail), (len(data), *tail))
        mspace = h5s.create_simple(data.shape)
    else:
        fspace.select_none()
        data = np.zeros((1, *tail), dset.dtype)
        mspace = h5s.create_simple(data.shape)
        mspace.select_none()
    dset.id.write(mspace, fspace, np.ascontiguousarray(data, dset.dtype), dxpl=dxpl)
