"""Read a token file as equal, shuffled, resumable per-rank batches of token windows.

A sample is window ``i`` of ``S + 1`` tokens starting at token ``i * S``
(`hpcdp.data.format.tokens`); windows run across document boundaries, which the
end-of-document tokens in the stream mark. The windows are the "samples" of
`hpcdp.data.read.order`, so the token reader keeps the image reader's promises
with the same arithmetic: an order that depends on the seed, epoch and global
batch but not on the world size, each window at most once per epoch, the same
number of steps on every rank, and exact mid-epoch resume from a small state,
also into another world size that divides the stored virtual shards.

Reads are contiguous: a run of consecutive windows ``[a, b)`` is the one token
slice ``[a*S, b*S + 1)``, and blocks of windows are about one chunk of tokens.
Each of this rank's streams holds one shuffle window of windows at a time
(`window_bytes`), so memory does not grow with the file. A background thread
(`hpcdp.data.read.prefetch`) reads and builds batches `prefetch` steps ahead.

Batches are ``(inputs, targets)``: int64 tensors of shape ``(batch_size, S)``,
``targets[:, t] == inputs[:, t + 1]`` within the window's ``S + 1`` tokens.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from hpcdp.data.format import tokens as tk
from hpcdp.data.read import epochs as ep
from hpcdp.data.read import order as pt
from hpcdp.data.read.protocol import ReadOptions, read_options

#: Default shuffle window per stream, in bytes of file tokens (rounded to whole blocks).
WINDOW_BYTES = 4 << 20

STATE_KEYS = (*ep.STATE_KEYS, "seq_len")

Batch = tuple[torch.Tensor, torch.Tensor]


class TokenReaderError(ValueError):
    """Bad input for the token reader: the message names the file and the problem."""


def default_window(block: int, seq_len: int, itemsize: int) -> int:
    """About `WINDOW_BYTES` of tokens per stream in whole blocks; independent of world size."""
    return block * max(1, WINDOW_BYTES // max(1, block * (seq_len + 1) * itemsize))


def eval_share(num_windows: int, rank: int, world_size: int) -> tuple[int, int]:
    """Rank `rank`'s contiguous windows ``[lo, hi)`` for evaluation: every window on
    exactly one rank, shares differing by at most one window."""
    return rank * num_windows // world_size, (rank + 1) * num_windows // world_size


def windows_from_tokens(run_tokens: np.ndarray, count: int, seq_len: int) -> np.ndarray:
    """Rows ``k`` = ``run_tokens[k*S : k*S + S + 1]`` for ``k < count`` (a strided view)."""
    item = run_tokens.strides[0]
    return np.lib.stride_tricks.as_strided(
        run_tokens, shape=(count, seq_len + 1), strides=(seq_len * item, item), writeable=False)


class _Stream:
    """One stream's served windows, read one shuffle window at a time (prefetch thread)."""

    def __init__(self, reader: TokenReader, tokens: Any, stream: int, order: np.ndarray,
                 offsets: np.ndarray, position: int) -> None:
        self._r, self._tokens, self._stream = reader, tokens, stream
        self._order, self._offsets = order, offsets
        self._k = position // reader.window
        self._rows = self._load(self._k)
        self._at = position - self._k * reader.window

    def _load(self, k: int) -> np.ndarray:
        r = self._r
        a, b = pt.window_bounds(r._stream_len, r.window, k)
        runs = pt.stream_runs(r.num_samples, r.block, self._order, r._stream_len, self._stream,
                              a, b, self._offsets)
        rows = np.empty((b - a, r.seq_len + 1), r.info.dtype)
        filled = 0
        for start, stop in runs:
            chunk = np.asarray(self._tokens[start * r.seq_len : stop * r.seq_len + 1])
            r.check_ids(chunk, start * r.seq_len)
            rows[filled : filled + stop - start] = windows_from_tokens(
                chunk, stop - start, r.seq_len)
            filled += stop - start
        perm = pt.window_permutation(r.seed, r.epoch, self._stream, k, b - a)
        return rows[perm]

    def take(self, count: int) -> np.ndarray:
        """The next `count` windows, crossing into the next shuffle window when needed."""
        parts = []
        while count:
            if self._at == len(self._rows):
                self._k += 1
                self._rows, self._at = self._load(self._k), 0
            n = min(count, len(self._rows) - self._at)
            parts.append(self._rows[self._at : self._at + n])
            self._at += n
            count -= n
        return parts[0] if len(parts) == 1 else np.concatenate(parts)


class TokenReader(ep.EpochReader):
    """This rank's share of a token file, as shuffled, equal, resumable batches of windows.

    `batch_size` is per rank; `seq_len` is S (each window has S + 1 tokens).
    Call `set_epoch(e)` before each epoch; `state_dict()` / `load_state_dict()`
    resume exactly mid-epoch, also into another world size. The public shape
    matches `hpcdp.data.read.samples.ShardedReader`, so a trainer can use either.
    """

    error = TokenReaderError
    unit = "window"
    state_keys = STATE_KEYS
    #: Token states have recorded their order since the first token reader.
    unversioned_order = pt.ORDER_VERSION
    transient = ("_file", "_pid", "_active")

    def __init__(
        self,
        path: str | os.PathLike[str],
        options: ReadOptions | None = None,
        *,
        seq_len: int,
        tokenizer_sha256: str | None = None,
        **read: Any,
    ) -> None:
        """`options` (or its fields as keywords: batch_size=..., rank=...) say how this
        rank reads; `seq_len` is S, the tokens of context in a window."""
        opts = read_options(options, read)
        batch_size, rank, world_size = opts.batch_size, opts.rank, opts.world_size
        seed, prefetch = opts.seed, opts.prefetch
        path = os.fspath(path)
        if batch_size < 1:
            raise TokenReaderError(f"{path}: batch_size must be at least 1, got {batch_size}")
        if world_size < 1 or not 0 <= rank < world_size:
            raise TokenReaderError(f"{path}: rank {rank} is outside a world of {world_size}")
        if seed < 0 or prefetch < 0:
            raise TokenReaderError(f"{path}: seed and prefetch must be non-negative")
        self.path, self.seq_len, self.batch_size = path, seq_len, batch_size
        self.rank, self.world_size = rank, world_size
        self.global_batch = batch_size * world_size
        try:
            self.info = tk.validate_tokens(path, seq_len=seq_len, global_batch=self.global_batch,
                                           tokenizer_sha256=tokenizer_sha256)
        except tk.TokenFormatError as exc:
            raise TokenReaderError(str(exc)) from exc
        self.num_samples = self.info.windows(seq_len)
        self.block = tk.window_block(self.info.chunk, seq_len)
        self.prefetch = prefetch
        self._start_epochs(
            seed,
            opts.window_samples or default_window(self.block, seq_len, self.info.dtype.itemsize),
            opts.virtual_shards)
        self._file: Any = None
        self._pid: int | None = None

    @property
    def vocab_size(self) -> int:
        return self.info.vocab_size

    @property
    def eod_id(self) -> int:
        return self.info.eod_id

    @property
    def sample_shape(self) -> tuple[int, ...]:
        """The shape of one input sample: ``(S,)`` token ids."""
        return (self.seq_len,)

    @property
    def sample_bytes(self) -> int:
        """File bytes of one window: ``S + 1`` tokens."""
        return (self.seq_len + 1) * self.info.dtype.itemsize

    @property
    def tokens_per_step(self) -> int:
        """Target tokens in one global batch (what tokens/s counts)."""
        return self.global_batch * self.seq_len

    def state_dict(self) -> dict[str, int]:
        """Where this epoch stands, and the sequence length that defines its windows."""
        return {**super().state_dict(), "seq_len": self.seq_len}

    def _check_state(self, st: dict[str, int], order: int) -> None:
        if st["seq_len"] != self.seq_len:
            raise TokenReaderError(
                f"{self.path}: the reader state is for sequence length {st['seq_len']}, this "
                f"reader has {self.seq_len}: its windows are other windows")
        super()._check_state(st, order)

    # -- I/O ----------------------------------------------------------------------------

    def _tokens(self) -> Any:
        """The open token dataset, opening the file on first use in this process."""
        if self._file is None or self._pid != os.getpid():
            import h5py

            self._file = h5py.File(self.path, "r")  # a parent's handle is not ours to close
            self._pid = os.getpid()
        return self._file[tk.TOKENS]

    def check_ids(self, chunk: np.ndarray, start: int) -> None:
        """Every id read must index the embedding: a bad one names its file position."""
        if len(chunk) and int(chunk.max()) >= self.info.vocab_size:
            at = int(np.argmax(chunk >= self.info.vocab_size))
            raise TokenReaderError(
                f"{self.path}: token id {int(chunk[at])} at position {start + at} is not below "
                f"the vocabulary size {self.info.vocab_size}")

    def _batches(self, position: int, steps: int) -> Iterator[Batch]:
        """The pass's batches as tensors (runs in the prefetch thread)."""
        tokens = self._tokens()
        order = pt.epoch_block_order(self.num_samples, self.block, self.seed, self.epoch)
        offsets = pt.block_offsets(self.num_samples, self.block, order)
        streams = [_Stream(self, tokens, v, order, offsets, position)
                   for v in pt.rank_streams(self.virtual_shards, self.world_size, self.rank)]
        for _ in range(steps):
            rows = np.concatenate([s.take(self.per_stream) for s in streams])
            # Widened and made contiguous by numpy in one pass each: torch's copy of a
            # strided view may fan out to its worker threads, which cost far more than
            # they give for a few hundred KiB on cores the training already uses.
            yield (torch.from_numpy(rows[:, :-1].astype(np.int64)),
                   torch.from_numpy(rows[:, 1:].astype(np.int64)))

    def __iter__(self) -> Iterator[Batch]:
        steps = len(self)
        items = self._batches(self._position, steps) if steps else iter(())
        return self._serve(items, steps, bool(self.prefetch), thread_name="hpcdp-tokens")

    def eval_batches(self, batch_size: int | None = None) -> Iterator[Batch]:
        """This rank's share of every window (`eval_share`), in file order, unshuffled.

        For validation: over all ranks each window is scored exactly once. The last
        batch may be short and ranks may get one batch more or fewer than others, so
        a caller reduces sums and counts, not per-rank means, after the loop. Reads
        go straight through HDF5 (no prefetch thread); memory is one batch.
        """
        size = batch_size or self.batch_size
        lo, hi = eval_share(self.num_samples, self.rank, self.world_size)
        tokens = self._tokens()
        for a in range(lo, hi, size):
            b = min(hi, a + size)
            run = np.asarray(tokens[a * self.seq_len : b * self.seq_len + 1])
            self.check_ids(run, a * self.seq_len)
            rows = windows_from_tokens(run, b - a, self.seq_len)
            yield (torch.from_numpy(rows[:, :-1].astype(np.int64)),
                   torch.from_numpy(rows[:, 1:].astype(np.int64)))

    def close(self) -> None:
        """Stop the prefetch thread and close the file (reopened if used again)."""
        self._stop_active()
        if self._file is not None and self._pid == os.getpid():
            with contextlib.suppress(Exception):
                self._file.close()
        self._file, self._pid = None, None


def reference_order(reader: TokenReader, position: int = 0) -> np.ndarray:
    """The global batches of window indices from stream `position` on, shape ``(steps, G)``.

    What one rank owning every stream reads (the world size plays no part), for
    tests that compare what several ranks read against it.
    """
    return pt.global_order(reader.num_samples, reader.block, reader.seed, reader.epoch,
                           reader.global_batch, reader.virtual_shards, reader.window,
                           position=position, stream_len=reader._stream_len)
