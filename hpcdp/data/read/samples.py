"""Read a samples-first HDF5 file as equal, shuffled, resumable per-rank batches.

Each rank reads only its own streams (see `hpcdp.data.read.order`), a window
of samples at a time, in contiguous row ranges (whole chunks where possible):
never one sample at a time and never scattered-row fancy indexing, which are
one to two orders of magnitude slower on HDF5. A background thread builds the
batches (`hpcdp.data.read.windows`) `prefetch` batches ahead of the consumer, so
reading overlaps compute and memory is bounded by about two windows
(`window_bytes` each) plus the prefetched batches, not by the file.

Through HDF5, batches are views into the window arrays: keep a batch past the
next few steps and the reader allocates new windows instead of reusing them
(still correct, just more memory).

Batches from an uncompressed, unfiltered dataset are gathered straight from the
file mapped read-only (`hpcdp.data.read.windows.RowMap`): one copy per byte instead
of two, and such batches are fresh arrays, not views. Memory is then the
batches plus about one window of mapped file pages (dropped window by window;
they stay in the page cache), and without a transform or pinning the batches
are built in the consumer's thread (see `ShardedReader._threaded`). `mmap=False`
or HPCDP_READER_MMAP=0 in the environment read through HDF5 instead; so does any
dataset whose rows cannot be located in the file (compressed, filtered, a user
block, byte-swapped, ...). Do not truncate or rewrite a file while a reader maps
it: reading a page the file no longer has kills the process (SIGBUS; hpcdp's
commands then print the Python stack, which names the reader's gather).

The file is opened (and mapped) lazily in the process that reads it, and again
after a fork, so a reader can be handed to forked or spawned worker processes.

The remainder of an epoch smaller than one global batch is dropped, so that
every rank takes the same number of steps.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any

import h5py
import numpy as np
import torch

from hpcdp.data.format.samples import (  # noqa: F401  (the readers' errors and checks, re-exported)
    DatasetInfo,
    ReaderError,
    open_h5,
    validate_dataset,
)
from hpcdp.data.read import order as pt
from hpcdp.data.read.epochs import EpochReader
from hpcdp.data.read.protocol import ReadOptions, read_options
from hpcdp.data.read.windows import Assembler, Plan, Recycler, RowMap

#: Default in-memory shuffle window per stream, in bytes (rounded to whole blocks).
WINDOW_BYTES = 4 << 20
#: Environment switch for the mapped-file path ("0", "false", "no" or "off" turn it off).
MMAP_ENV = "HPCDP_READER_MMAP"


def mmap_enabled() -> bool:
    """The mapped-file path's default: on unless HPCDP_READER_MMAP says otherwise."""
    return os.environ.get(MMAP_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def default_window(block: int, sample_bytes: int) -> int:
    """About `WINDOW_BYTES` per stream in whole blocks; independent of the world size."""
    return block * max(1, WINDOW_BYTES // max(1, block * sample_bytes))


def _check_arguments(path: Any, **args: Any) -> str:
    """The constructor's arguments, checked: `ReaderError` names the bad one."""
    if not isinstance(path, (str, os.PathLike)):
        raise ReaderError(f"path must be a file path, got {path!r}")
    path = os.fspath(path)
    if not isinstance(path, str) or not path or "\0" in path:
        raise ReaderError(f"path must be a file path, got {path!r}")

    def integer(name: str, minimum: int, none_ok: bool = False) -> None:
        value = args[name]
        if none_ok and value is None:
            return
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise ReaderError(f"{path}: {name} must be an integer, got {value!r}")
        if value < minimum:
            raise ReaderError(f"{path}: {name} must be at least {minimum}, got {value}")

    integer("batch_size", 1)
    integer("world_size", 1)
    integer("rank", 0)
    if args["rank"] >= args["world_size"]:
        raise ReaderError(f"{path}: rank {args['rank']} is outside a world of "
                          f"{args['world_size']}")
    integer("seed", 0)
    integer("prefetch", 0)
    integer("window_samples", 0, none_ok=True)  # 0 or None: the default window
    integer("virtual_shards", 0, none_ok=True)
    for name in ("x_name", "y_name"):
        value = args[name]
        if value is None and name == "y_name":
            continue
        if not isinstance(value, str) or not value or "\0" in value or not _utf8(value):
            raise ReaderError(f"{path}: {name} must be a dataset name, got {value!r}")
    if args["mmap"] not in (None, True, False):
        raise ReaderError(f"{path}: mmap must be True, False or None, got {args['mmap']!r}")
    if args["transform"] is not None and not callable(args["transform"]):
        raise ReaderError(f"{path}: transform must be callable, got {args['transform']!r}")
    return path


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class ShardedReader(EpochReader):
    """This rank's share of a samples-first HDF5 file, as shuffled, equal, resumable batches.

    `batch_size` is per rank. The global order of an epoch depends on the seed,
    epoch, global batch, virtual shards and window, never on the world size.
    Call `set_epoch(e)` before each epoch; `state_dict()` / `load_state_dict()`
    resume exactly mid-epoch, also into another world size that divides the
    stored virtual shards.
    """

    error = ReaderError
    transient = ("_file", "_dsets", "_pid", "_active", "_recyclers", "_rows", "_rows_pid")

    def __init__(
        self,
        path: str | os.PathLike[str],
        options: ReadOptions | None = None,
        *,
        x_name: str = "x",
        y_name: str | None = "y",
        pin_memory: bool = False,
        transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
        mmap: bool | None = None,
        **read: Any,
    ) -> None:
        """`options` (or its fields as keywords: batch_size=..., rank=...) say how this
        rank reads; the rest is this reader's own."""
        opts = read_options(options, read)
        batch_size, window_samples, prefetch = opts.batch_size, opts.window_samples, opts.prefetch
        path = _check_arguments(
            path, batch_size=batch_size, rank=opts.rank, world_size=opts.world_size,
            seed=opts.seed, window_samples=window_samples, virtual_shards=opts.virtual_shards,
            prefetch=prefetch, x_name=x_name, y_name=y_name, mmap=mmap, transform=transform,
        )
        self.path = path
        self.batch_size = batch_size
        self.rank = opts.rank
        self.world_size = opts.world_size
        self.global_batch = batch_size * opts.world_size
        self.info = validate_dataset(path, x_name, y_name, min_samples=self.global_batch)
        if self.info.dtype.kind not in "biuf":
            raise ReaderError(f"{path}: dataset {x_name!r} has dtype {self.info.dtype}; "
                              "numeric samples needed")
        self.prefetch = prefetch
        self.pin_memory = pin_memory
        self.transform = transform
        self.mmap = mmap_enabled() if mmap is None else mmap
        self._start_epochs(
            opts.seed, window_samples or default_window(self.info.block, self.info.sample_bytes),
            opts.virtual_shards)
        self._file: h5py.File | None = None
        self._dsets: tuple[h5py.Dataset, h5py.Dataset | None] | None = None
        self._pid: int | None = None
        self._recyclers: tuple[Recycler, Recycler] | None = None
        self._rows: RowMap | None = None
        self._rows_pid: int | None = None

    @property
    def num_samples(self) -> int:
        return self.info.num_samples

    @property
    def block(self) -> int:
        return self.info.block

    @property
    def sample_bytes(self) -> int:
        return self.info.sample_bytes

    @property
    def sample_shape(self) -> tuple[int, ...]:
        return self.info.sample_shape

    @property
    def dtype(self) -> np.dtype:
        return self.info.dtype

    # -- I/O ----------------------------------------------------------------------------

    def _datasets(self) -> tuple[h5py.Dataset, h5py.Dataset | None]:
        """The open datasets, opening the file on first use in this process."""
        if self._file is None or self._pid != os.getpid():
            # After a fork the parent's handle is not ours to use (nor to close).
            self._file = open_h5(self.path)
            self._pid = os.getpid()
            f = self._file
            y = f[self.info.y_name] if self.info.y_name is not None else None
            self._dsets = (f[self.info.x_name], y)  # looked up once: ~40 us each time
        assert self._dsets is not None
        return self._dsets

    def _row_map(self, x: h5py.Dataset) -> RowMap | None:
        """This process's map of the file, made on first use; None when it cannot be used."""
        if not self.mmap:
            return None
        if self._rows_pid != os.getpid():
            self._rows = RowMap.open(self.path, x)  # a parent's mapping is dropped, not closed
            self._rows_pid = os.getpid()
        return self._rows

    @property
    def mapped(self) -> bool:
        """Whether batches are gathered from the mapped file (else read through HDF5)."""
        return self._row_map(self._datasets()[0]) is not None

    def _plan(self) -> Plan:
        return Plan(
            num_samples=self.info.num_samples,
            block=self.info.block,
            seed=self.seed,
            epoch=self.epoch,
            stream_len=self._stream_len,
            window=self.window,
            per_stream=self.per_stream,
            streams=pt.rank_streams(self.virtual_shards, self.world_size, self.rank),
            position=self._position,
            steps=len(self),
        )

    def _batches(self, plan: Plan) -> Iterator[tuple[torch.Tensor, torch.Tensor | None]]:
        """The pass's batches as tensors (runs in the prefetch thread)."""
        x, y = self._datasets()
        if self._recyclers is None:
            self._recyclers = (Recycler(), Recycler())
        asm = Assembler(plan, x, y, self.info.sample_shape, self.info.dtype, self.batch_size,
                        self._recyclers, read_ahead=False, rows=self._row_map(x))
        pin = self.pin_memory and torch.cuda.is_available()
        for bx, by in asm:
            tx = torch.from_numpy(bx)
            ty = torch.from_numpy(by) if by is not None else None
            if self.transform is not None:
                tx = self.transform(tx)
            if pin:
                tx = tx.pin_memory()
                ty = ty.pin_memory() if ty is not None else None
            yield tx, ty

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor | None]]:
        plan = self._plan()
        return self._serve(self._batches(plan), plan.steps, self._threaded())

    def _threaded(self) -> bool:
        """Whether to build batches in a prefetch thread, `prefetch` batches ahead.

        The thread hides HDF5 reads, a transform or pinning behind the consumer's
        compute. From the mapped file without a transform or pinning there is nothing
        left to hide: the kernel already reads a window ahead, and a batch costs one
        copy at memory speed, less than handing it over between threads
        (docs/measured-choices.md).
        """
        if not self.prefetch:
            return False
        if self.transform is not None or (self.pin_memory and torch.cuda.is_available()):
            return True
        return not self.mapped

    def close(self) -> None:
        """Stop the prefetch thread and close the file (reopened if used again)."""
        self._stop_active()
        if self._file is not None and self._pid == os.getpid():
            with contextlib.suppress(Exception):
                self._file.close()
        if self._rows is not None and self._rows_pid == os.getpid():
            self._rows.close()
        self._file = None
        self._dsets = None
        self._pid = None
        self._rows = None
        self._rows_pid = None
        self._recyclers = None
