"""Turn one rank's streams into batches with one read pass and one scatter pass.

For each window (all of a rank's streams cross window boundaries together, as
they advance in lockstep), every stream's window is read in contiguous row
ranges into a small staging buffer that stays in cache, and each row is copied
once, straight to its place in a batch-major array: the window shuffle and the
interleaving of streams happen in that single copy. Batches that lie wholly in
the window are then views of that array (no further copy); a batch that
straddles two windows is filled from both.

This is the I/O half of the reader; which rows go where comes from
`hpcdp.data.partition`.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass

import h5py
import numpy as np
from h5py import h5s

from hpcdp.data import partition as pt
from hpcdp.data.prefetch import Inline, Prefetcher

#: Bytes read per HDF5 call at most (whole blocks, at least one), so staging stays in cache.
STAGING_BYTES = 1 << 20

Batch = tuple[np.ndarray, np.ndarray | None]


@dataclass(frozen=True)
class Plan:
    """What one pass over the rest of an epoch reads (a snapshot of the reader's state)."""

    num_samples: int
    block: int
    seed: int
    epoch: int
    stream_len: int
    window: int
    per_stream: int
    streams: range
    position: int
    steps: int


class Labels:
    """Labels read a whole label chunk at a time (one HDF5 call), a few chunks kept.

    Labels are tiny next to samples; reading them run by run would double the
    number of HDF5 calls for no data.
    """

    KEEP_BYTES = 4 << 20

    def __init__(self, dset: h5py.Dataset) -> None:
        self._dset = dset
        n = int(dset.shape[0])
        # At least 16384 labels per read, even from a file with tiny label chunks.
        rows = max(int(dset.chunks[0]) if dset.chunks is not None else 1 << 16, 1 << 14)
        self._rows = max(1, min(rows, n))
        self._keep = max(2, self.KEEP_BYTES // (self._rows * 8))
        self._cache: dict[int, np.ndarray] = {}

    def _chunk(self, c: int) -> np.ndarray:
        got = self._cache.pop(c, None)
        if got is None:
            lo = c * self._rows
            got = np.asarray(self._dset[lo : lo + self._rows], dtype=np.int64)
            if len(self._cache) >= self._keep:
                self._cache.pop(next(iter(self._cache)))
        self._cache[c] = got  # most recently used last
        return got

    def read(self, start: int, stop: int, out: np.ndarray) -> None:
        """Labels of rows [start, stop) into out[:stop - start]."""
        pos = start
        while pos < stop:
            c = pos // self._rows
            lo = c * self._rows
            m = min(stop, lo + self._rows) - pos
            out[pos - start : pos - start + m] = self._chunk(c)[pos - lo : pos - lo + m]
            pos += m


class Recycler:
    """Arrays reused once nobody holds them (or a view of them) any more.

    A fresh array per window costs page faults on every byte; an array whose only
    references are this pool's can safely be filled again, because every tensor
    or view handed out keeps a reference to it.
    """

    def __init__(self, keep: int = 3) -> None:
        self._keep = keep
        self._arrays: list[np.ndarray] = []
        # The count an array shows here when only this pool holds it (the list, the
        # local name, getrefcount's argument), measured rather than assumed.
        probe = [np.empty(1)]
        a = probe[0]
        self._free = sys.getrefcount(a)
        view = a[:]
        if sys.getrefcount(a) <= self._free:  # pragma: no cover - views must count
            self._free = -1  # never reuse: this interpreter does not show view references
        del view

    def get(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        for i in range(len(self._arrays)):
            a = self._arrays[i]
            if a.shape == shape and a.dtype == dtype and sys.getrefcount(a) == self._free:
                return a
        fresh = np.empty(shape, dtype)
        if len(self._arrays) >= self._keep:
            self._arrays.pop(0)
        self._arrays.append(fresh)
        return fresh


def _rows_view(a: np.ndarray, rows: int, row_items: int) -> np.ndarray:
    """A 1-D view with one opaque item per sample, so that fancy copies move whole rows."""
    flat = a.reshape(rows, row_items)
    return flat.view(np.dtype((np.void, row_items * a.dtype.itemsize))).reshape(rows)


class Assembler:
    """Produces this rank's batches for a `Plan`, in order, reading each window once.

    With `read_ahead`, the HDF5 reads run in a thread of their own, a few staging
    buffers ahead of the copying (both release the GIL), so the two can overlap on
    a machine with a spare core. The reader leaves it off: on the shared 2-core
    development machine it measured no gain (0.20-0.25 of raw slab reads with it,
    0.26-0.27 without).
    """

    READ_AHEAD = 2

    def __init__(self, plan: Plan, x: h5py.Dataset, y: h5py.Dataset | None,
                 sample_shape: tuple[int, ...], dtype: np.dtype, batch: int,
                 recyclers: tuple[Recycler, Recycler], read_ahead: bool = False) -> None:
        self.plan, self._x, self.shape, self.dtype, self.b = plan, x, sample_shape, dtype, batch
        self._labels = Labels(y) if y is not None else None
        self._recycle_x, self._recycle_y = recyclers
        self._read_ahead = read_ahead
        self._row_items = int(np.prod(sample_shape, dtype=np.int64))
        self._order = pt.epoch_block_order(plan.num_samples, plan.block, plan.seed, plan.epoch)
        self._offsets = pt.block_offsets(plan.num_samples, plan.block, self._order)
        sample_bytes = self._row_items * dtype.itemsize
        # Whole blocks (the file's chunks), so no read splits a chunk in two.
        per_block = max(1, plan.block * sample_bytes)
        self._stage_rows = min(plan.num_samples,
                               plan.block * max(1, STAGING_BYTES // per_block))

    def _windows(self) -> range:
        p = self.plan
        end = p.position + p.steps * p.per_stream
        return range(p.position // p.window, (end - 1) // p.window + 1)

    def _pieces(self) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, int]]:
        """Every window's rows, stream by stream, in contiguous pieces of whole blocks.

        Yields (samples, sample rows as opaque items, labels, rows) in rotating
        staging buffers: enough of them that the consumer is done with a buffer
        before it is filled again (the read-ahead queue depth + 2).
        """
        p = self.plan
        stage_shape = (self._stage_rows, *self.shape)
        buffers = []
        for _ in range(self.READ_AHEAD + 2):
            sx = np.empty(stage_shape, self.dtype)
            buffers.append((sx, _rows_view(sx, self._stage_rows, self._row_items),
                            np.zeros(self._stage_rows, np.int64)))
        fspace = self._x.id.get_space()
        mspace = h5s.create_simple(stage_shape)
        zeros = (0,) * len(self.shape)
        n = 0
        for k in self._windows():
            ws, we = pt.window_bounds(p.stream_len, p.window, k)
            for v in p.streams:
                for start, stop in pt.stream_runs(p.num_samples, p.block, self._order,
                                                  p.stream_len, v, ws, we, self._offsets):
                    for a in range(start, stop, self._stage_rows):
                        m = min(stop, a + self._stage_rows) - a
                        sx, items, sy = buffers[n % len(buffers)]
                        count = (m, *self.shape)
                        fspace.select_hyperslab((a, *zeros), count)
                        mspace.select_hyperslab((0, *zeros), count)
                        self._x.id.read(mspace, fspace, sx)
                        if self._labels is not None:
                            self._labels.read(a, a + m, sy)
                        n += 1
                        yield sx, items, sy, m

    def __iter__(self) -> Iterator[Batch]:
        p = self.plan
        if p.steps <= 0:
            return
        source: Prefetcher | Inline = (
            Prefetcher(self._pieces(), self.READ_AHEAD, name="hpcdp-reader-io")
            if self._read_ahead else Inline(self._pieces())
        )
        try:
            yield from self._batches(source)
        finally:
            source.stop()

    def _batches(self, source: Prefetcher | Inline) -> Iterator[Batch]:
        p = self.plan
        u, b, w, n = p.per_stream, self.b, p.window, len(p.streams)
        end = p.position + p.steps * u  # stream positions this pass consumes
        prev: Batch | None = None  # the batch left incomplete by the previous window
        rows = -(-w // u) + 1
        for k in self._windows():
            ws, we = pt.window_bounds(p.stream_len, w, k)
            lo, hi = max(ws, p.position), min(we, end)
            first = (lo - p.position) // u  # steps this window touches: [first, last]
            last = (hi - 1 - p.position) // u
            # One shape for every window (a window touches at most ceil(w/u) + 1 steps),
            # so that freed arrays are reused instead of reallocated.
            bx = self._recycle_x.get((rows, b, *self.shape), self.dtype)
            by = (self._recycle_y.get((rows, b), np.dtype(np.int64))
                  if self._labels is not None else None)
            items = _rows_view(bx, rows * b, self._row_items)
            for i, v in enumerate(p.streams):
                self._fill_stream(source, i, v, k, ws, we, first, items, by)
            head = lo - (p.position + first * u)  # positions of step `first` read earlier
            if head and prev is not None:
                px, py = prev
                bx[0].reshape(n, u, -1)[:, :head] = px.reshape(n, u, -1)[:, :head]
                if by is not None and py is not None:
                    by[0].reshape(n, u)[:, :head] = py.reshape(n, u)[:, :head]
            done = (hi - p.position) // u  # steps complete now: [first, done)
            for j in range(first, done):
                yield bx[j - first], (by[j - first] if by is not None else None)
            tail = last - first  # the last touched step, incomplete when done <= last
            # A copy: holding a view would keep this whole window's array from reuse.
            prev = ((bx[tail].copy(), by[tail].copy() if by is not None else None)
                    if done <= last else None)
            bx = by = items = None  # type: ignore[assignment]  # let the recycler see them free

    def _fill_stream(self, source: Prefetcher | Inline, i: int, v: int, k: int, ws: int,
                     we: int, first: int, items: np.ndarray, by: np.ndarray | None) -> None:
        """Copy stream v's window k, piece by piece, each row once to its batch slot."""
        p, u, b = self.plan, self.plan.per_stream, self.b
        perm = pt.window_permutation(p.seed, p.epoch, v, k, we - ws)
        served = np.empty_like(perm)
        served[perm] = np.arange(len(perm))  # read row r is served at window offset served[r]
        rel = ws + served - p.position  # stream position relative to this pass
        slot = (rel // u - first) * b + i * u + rel % u
        valid = (rel >= 0) & (rel < p.steps * u)  # not before a resume point, nor dropped
        every = bool(valid.all())
        flat_y = by.reshape(-1) if by is not None else None
        r0 = 0
        while r0 < we - ws:
            _, stage_items, stage_y, m = source.get()
            sl = slot[r0 : r0 + m]
            if every:
                items[sl] = stage_items[:m]
                if flat_y is not None:
                    flat_y[sl] = stage_y[:m]
            else:
                ok = valid[r0 : r0 + m]
                items[sl[ok]] = stage_items[:m][ok]
                if flat_y is not None:
                    flat_y[sl[ok]] = stage_y[:m][ok]
            r0 += m
