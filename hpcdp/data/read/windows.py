"""Turn one rank's streams into batches with one read pass and one scatter pass.

For each window (all of a rank's streams cross window boundaries together, as
they advance in lockstep), every stream's window is read in contiguous row
ranges into a small staging buffer that stays in cache, and each row is copied
once, straight to its place in a batch-major array: the window shuffle and the
interleaving of streams happen in that single copy. Batches that lie wholly in
the window are then views of that array (no further copy); a batch that
straddles two windows is filled from both.

For an uncompressed, unfiltered dataset whose rows can be located in the file
(`RowMap.open`), the reader skips HDF5 and the staging copy altogether: the file
is mapped read-only and each batch is gathered with one fancy index straight
from the page cache into a fresh batch array, one copy per byte like raw slab
reads. The kernel is asked to read the next window's runs ahead (MADV_WILLNEED,
whole chunks, each run in file order), and a consumed window's pages are
unmapped from this process (MADV_DONTNEED; they stay in the page cache), so that
resident memory stays bounded by about a window.

This is the I/O half of the reader; which rows go where comes from
`hpcdp.data.read.order`.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import mmap
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import h5py
import numpy as np
from h5py import h5d, h5s

from hpcdp.data.read import order as pt
from hpcdp.data.read.prefetch import Inline, Prefetcher

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

    @property
    def window_read(self) -> int:
        """Samples of a stream read per window: a window longer than the stream is the
        stream, and arrays are sized by what is read, not by the configured window."""
        return min(self.window, self.stream_len)


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


class RowMap:
    """The dataset's rows read straight from the file, mapped read-only.

    Built only for layouts whose bytes are the samples themselves: contiguous, or
    chunked along the first axis only, no filters, no external storage, a plain
    numeric dtype, every chunk written at full size. Anything else returns None
    from `open` and the reader reads through HDF5.
    """

    def __init__(self, path: str, pieces: np.ndarray, piece_rows: int,
                 sample_bytes: int) -> None:
        self._pieces, self._piece_rows, self._sb = pieces, piece_rows, sample_bytes
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if int(pieces.max()) + piece_rows * sample_bytes > size or int(pieces.min()) < 0:
                raise ValueError(f"{path}: the dataset's storage lies past the end of the file")
            self._mm: mmap.mmap | None = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        # One opaque sample-sized item starting at every byte of the file: a fancy index
        # by byte offset then copies whole samples, wherever each chunk starts.
        self._items: np.ndarray | None = np.ndarray(
            (size - sample_bytes + 1,), np.dtype((np.void, sample_bytes)), buffer=self._mm,
            strides=(1,))
        self._probe = ctypes.create_string_buffer(1)  # mincore's answer for one page
        self._base = int(self._items.ctypes.data)  # the mapping's address, for mincore

    @classmethod
    def open(cls, path: str, dset: h5py.Dataset) -> RowMap | None:
        """The map of `dset` in `path`, or None when its rows cannot be read from its bytes."""
        located = locate_rows(dset)
        if located is None:
            return None
        sample_bytes = int(np.prod(dset.shape[1:], dtype=np.int64)) * dset.dtype.itemsize
        try:
            rows = cls(path, *located, sample_bytes)
        except (OSError, ValueError):
            return None
        # The offsets are HDF5 addresses; check that they are this file's bytes (a user
        # block or an unusual driver would shift them) on the first and last sample.
        n = int(dset.shape[0])
        for r in sorted({0, n // 2, n - 1}):
            mapped = rows.gather(rows.offsets(np.array([r], np.int64))).tobytes()
            if mapped != np.ascontiguousarray(dset[r : r + 1]).tobytes():
                rows.close()
                return None
        return rows

    def offsets(self, rows: np.ndarray) -> np.ndarray:
        """Byte offsets in the file of the given rows."""
        return self._pieces[rows // self._piece_rows] + rows % self._piece_rows * self._sb

    def gather(self, offsets: np.ndarray) -> np.ndarray:
        """A fresh array of the samples at `offsets`, as opaque items (one copy)."""
        assert self._items is not None, "the row map is closed"
        return self._items[offsets]

    def advise(self, runs: Iterable[tuple[int, int]], advice: int) -> None:
        """madvise the pages of row runs, chunk by chunk, in order (a hint: errors ignored).

        MADV_WILLNEED is skipped for a piece whose first page is in the page cache
        already (the file was read before): on a warm cache the call costs about a
        quarter of the copy it would speed up, for nothing. A cold piece is asked
        for whole (the kernel starts reading it at once, in file order). When the
        first, middle and last runs all start in the page cache, the window is
        taken as warm and nothing more is checked: checking every piece cost ~3% of
        an epoch on a warm cache. (A window cached only in part then reads its cold
        pages as it faults them, with the kernel's own read-around.)
        """
        if self._mm is None:
            return
        runs = list(runs)
        if not runs or (advice == mmap.MADV_WILLNEED and self._warm(runs)):
            return
        pr, sb, page, pieces = self._piece_rows, self._sb, mmap.PAGESIZE, self._pieces
        for start, stop in runs:
            row = start
            while row < stop:
                end = min(stop, (row // pr + 1) * pr)
                a = int(pieces[row // pr]) + row % pr * sb
                lo, hi = a - a % page, a + (end - row) * sb
                if advice != mmap.MADV_WILLNEED or not self._cached(lo):
                    with contextlib.suppress(OSError, ValueError):
                        self._mm.madvise(advice, lo, hi - lo)
                row = end

    def _warm(self, runs: list[tuple[int, int]]) -> bool:
        """Whether the first pages of the first, middle and last runs are in the page cache."""
        rows = np.array([runs[0][0], runs[len(runs) // 2][0], runs[-1][0]], np.int64)
        return all(self._cached(a - a % mmap.PAGESIZE) for a in self.offsets(rows).tolist())

    def _cached(self, at: int) -> bool:
        """Whether the page at byte `at` (page-aligned) of the file is in the page cache."""
        if _MINCORE is None or self._items is None:
            return False
        ok = _MINCORE(self._base + at, mmap.PAGESIZE, self._probe) == 0
        return ok and bool(self._probe.raw[0] & 1)

    def drop(self) -> None:
        """Unmap every page this process touched (they stay in the page cache).

        One call for the whole mapping: per-range calls cost more than the pages.
        """
        if self._mm is not None:
            with contextlib.suppress(OSError, ValueError):
                self._mm.madvise(mmap.MADV_DONTNEED)

    def close(self) -> None:
        """Unmap the file (left to the garbage collector if something still views it)."""
        self._items = None
        mm, self._mm = self._mm, None
        if mm is not None:
            with contextlib.suppress(BufferError):
                mm.close()


def _mincore() -> Callable[[int, int, Any], int] | None:
    """libc's mincore (page cache residency), or None where it cannot be had."""
    try:
        fn = ctypes.CDLL(ctypes.util.find_library("c") or None).mincore
    except (AttributeError, OSError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    fn.restype = ctypes.c_int
    return fn  # type: ignore[no-any-return]


_MINCORE = _mincore()


def locate_rows(dset: h5py.Dataset) -> tuple[np.ndarray, int] | None:
    """(byte offset of each piece of rows, rows per piece) of `dset`, or None.

    A piece is a chunk (chunked layout) or the whole dataset (contiguous layout).
    None whenever the file's bytes are not simply the samples in row order.
    """
    dtype = dset.dtype
    if dtype.kind not in "biufc" or not dtype.isnative or dset.ndim < 1:
        return None
    n = int(dset.shape[0])
    sample_bytes = int(np.prod(dset.shape[1:], dtype=np.int64)) * dtype.itemsize
    try:
        dcpl = dset.id.get_create_plist()
        if dcpl.get_nfilters() or dcpl.get_external_count():
            return None
        layout = dcpl.get_layout()
        if layout == h5d.CONTIGUOUS:
            offset = dset.id.get_offset()
            return None if offset is None else (np.array([offset], np.int64), n)
        if layout != h5d.CHUNKED or tuple(dset.chunks[1:]) != tuple(dset.shape[1:]):
            return None
        rows = int(dset.chunks[0])
        count = -(-n // rows)
        if dset.id.get_num_chunks() != count:  # a chunk never written reads as fill value
            return None
        pieces = np.full(count, -1, np.int64)
        for i in range(count):
            info = dset.id.get_chunk_info(i)
            if info.byte_offset is None or info.size != rows * sample_bytes:
                return None
            pieces[info.chunk_offset[0] // rows] = info.byte_offset
    except (AttributeError, NotImplementedError, OSError, RuntimeError, ValueError):
        return None  # an HDF5 without chunk queries, or a layout it cannot describe
    return (pieces, rows) if (pieces >= 0).all() else None


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
                 recyclers: tuple[Recycler, Recycler], read_ahead: bool = False,
                 rows: RowMap | None = None) -> None:
        self.plan, self._x, self.shape, self.dtype, self.b = plan, x, sample_shape, dtype, batch
        self._map = rows
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
        if self._map is not None:
            yield from self._mapped_batches(self._map)
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
        u, b, w, n = p.per_stream, self.b, p.window_read, len(p.streams)
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

    def _slots(self, i: int, v: int, k: int, ws: int, we: int,
               first: int) -> tuple[np.ndarray, np.ndarray, bool]:
        """Where each row of stream v's window k (in read order) goes in the window's batches.

        Returns (slot in the flattened [step - first, batch] array, whether the row is
        served in this pass at all, whether every row is).
        """
        p, u, b = self.plan, self.plan.per_stream, self.b
        perm = pt.window_permutation(p.seed, p.epoch, v, k, we - ws)
        served = np.empty_like(perm)
        served[perm] = np.arange(len(perm))  # read row r is served at window offset served[r]
        rel = ws + served - p.position  # stream position relative to this pass
        slot = (rel // u - first) * b + i * u + rel % u
        valid = (rel >= 0) & (rel < p.steps * u)  # not before a resume point, nor dropped
        return slot, valid, bool(valid.all())

    def _window_runs(self, k: int) -> list[list[tuple[int, int]]]:
        """Each of this rank's streams' file row runs for window k, in read order."""
        p = self.plan
        ws, we = pt.window_bounds(p.stream_len, p.window, k)
        return [pt.stream_runs(p.num_samples, p.block, self._order, p.stream_len, v, ws, we,
                               self._offsets) for v in p.streams]

    def _mapped_batches(self, rows: RowMap) -> Iterator[Batch]:
        """The same batches as `_batches`, each gathered once from the mapped file.

        Per window, only where each batch slot's sample lies in the file is worked
        out (small integer arrays, all streams at once: `_mapped_slots`); the samples
        are copied once, batch by batch, into arrays small enough to stay in cache for
        the consumer.
        """
        p = self.plan
        u, b, w, n = p.per_stream, self.b, p.window_read, len(p.streams)
        end = p.position + p.steps * u
        nrows = -(-w // u) + 1  # steps a window touches at most (as in `_batches`)
        windows = self._windows()
        prev: tuple[np.ndarray, np.ndarray | None] | None = None
        here = self._window_runs(windows.start)
        rows.advise((r for runs in here for r in runs), mmap.MADV_WILLNEED)
        for k in windows:
            ahead = self._window_runs(k + 1) if k + 1 < windows.stop else []
            # Ask for the next window's runs now, so that the kernel reads them (in file
            # order) while this window's batches are gathered.
            rows.advise((r for runs in ahead for r in runs), mmap.MADV_WILLNEED)
            ws, we = pt.window_bounds(p.stream_len, w, k)
            lo, hi = max(ws, p.position), min(we, end)
            first = (lo - p.position) // u
            last = (hi - 1 - p.position) // u
            src, lab = self._mapped_slots(rows, here, k, (ws, we, lo, hi), first, prev)
            # Batch-major: step j's batch is every stream's u slots in stream order.
            src_b = src.reshape(n, nrows, u).transpose(1, 0, 2).reshape(nrows, b)
            lab_b = (lab.reshape(n, nrows, u).transpose(1, 0, 2).reshape(nrows, b)
                     if lab is not None else None)
            done = (hi - p.position) // u
            for j in range(first, done):
                bx = rows.gather(src_b[j - first]).view(self.dtype).reshape(b, *self.shape)
                yield bx, (lab_b[j - first] if lab_b is not None else None)
            tail = last - first
            # The incomplete last step's head, carried into the next window.
            prev = ((src[:, tail * u : (tail + 1) * u], None if lab is None else
                     lab[:, tail * u : (tail + 1) * u]) if done <= last else None)
            # This window's samples are copied out (but for a straddling step's head, which
            # faults back in from the page cache): unmap them, so that resident memory
            # stays bounded by about a window however large the file.
            rows.drop()
            here = ahead

    def _mapped_slots(self, rows: RowMap, here: list[list[tuple[int, int]]], k: int,
                      bounds: tuple[int, int, int, int], first: int,
                      prev: tuple[np.ndarray, np.ndarray | None] | None,
                      ) -> tuple[np.ndarray, np.ndarray | None]:
        """Window k's (file offset, label) of every slot of its steps, stream-major.

        `bounds` is (ws, we, lo, hi): the window's stream positions, and the part of
        them this pass serves; `here` the streams' file row runs for the window; `prev`
        the previous window's incomplete last step, whose head fills the first slots.
        Returns two (streams, steps x per_stream) arrays; no labels: None.
        """
        p, (ws, we, lo, hi) = self.plan, bounds
        u, n = p.per_stream, len(p.streams)
        nrows = -(-p.window_read // u) + 1
        # Stream i's window position q is served at position ws + q of its stream,
        # which is slot (q' // u, i*u + q' % u) of this window's steps, where
        # q' = ws + q - position - first*u: a plain reshape per stream, once the
        # rows are put in serving order (read order, permuted by the window's shuffle).
        length = we - ws
        perms = np.stack([pt.window_permutation(p.seed, p.epoch, v, k, length)
                          for v in p.streams])
        read_rows = np.stack([pt.runs_to_indices(runs) for runs in here])
        served = np.take_along_axis(read_rows, perms, axis=1)  # (streams, length)
        q0, q1 = lo - ws, hi - ws  # served this pass (not before a resume point)
        f0 = lo - p.position - first * u
        src = np.empty((n, nrows * u), np.int64)
        src[:, f0 : f0 + q1 - q0] = rows.offsets(served[:, q0:q1])
        lab = None
        if self._labels is not None:
            labels = self._run_labels(here, read_rows.shape)
            lab = np.empty((n, nrows * u), np.int64)
            lab[:, f0 : f0 + q1 - q0] = np.take_along_axis(labels, perms, axis=1)[:, q0:q1]
        if f0 and prev is not None:  # step `first` began in the previous window
            src[:, :f0] = prev[0][:, :f0]
            if lab is not None and prev[1] is not None:
                lab[:, :f0] = prev[1][:, :f0]
        return src, lab

    def _run_labels(self, here: list[list[tuple[int, int]]],
                    shape: tuple[int, ...]) -> np.ndarray:
        """The labels of each stream's runs, in read order: one row per stream."""
        assert self._labels is not None
        labels = np.empty(shape, np.int64)
        for i, runs in enumerate(here):
            at = 0
            for start, stop in runs:
                self._labels.read(start, stop, labels[i, at : at + stop - start])
                at += stop - start
        return labels

    def _fill_stream(self, source: Prefetcher | Inline, i: int, v: int, k: int, ws: int,
                     we: int, first: int, items: np.ndarray, by: np.ndarray | None) -> None:
        """Copy stream v's window k, piece by piece, each row once to its batch slot."""
        slot, valid, every = self._slots(i, v, k, ws, we, first)
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
