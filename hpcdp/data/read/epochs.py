"""Where a shuffled reader stands in its epochs, and the small state that resumes it.

`ShardedReader` (samples of a file) and `TokenReader` (token windows of a file)
serve their samples in the order of `hpcdp.data.read.order`, a function of
(samples, block, seed, epoch, global batch, virtual shards, window, position)
only. `EpochReader` holds the parts of that which change, moves them from epoch
to epoch, writes them as a state and checks a loaded state against the file and
the world before adopting it, so that both readers resume by one set of rules
and messages. A reader says what its samples are called, reads them, and may add
keys of its own to the state.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

from hpcdp.data.read import order as pt
from hpcdp.data.read.prefetch import Inline, Prefetcher

STATE_KEYS = (
    "seed", "epoch", "num_samples", "block", "virtual_shards", "stream_length", "window",
    "position",
)


class EpochReader:
    """Epochs, length and resume state of a reader of shuffled, equal, per-rank batches.

    A reader sets `path`, `batch_size`, `rank`, `world_size`, `global_batch`,
    `num_samples`, `block` and `sample_bytes`, then calls `_start_epochs`; it
    provides `close` and builds its batches, which `_serve` hands out.
    """

    #: The reader's error; every message starts with the file's path.
    error: type[ValueError] = ValueError
    #: What one sample is called in messages ("sample", "window").
    unit = "sample"
    #: Keys a state must hold (all integers).
    state_keys = STATE_KEYS
    #: The order version of a state written before states recorded theirs.
    unversioned_order = 1
    #: Attributes that belong to one process (open files, threads): not pickled.
    transient: tuple[str, ...] = ("_active",)

    path: str
    batch_size: int
    rank: int
    world_size: int
    global_batch: int
    num_samples: int
    block: int
    sample_bytes: int
    prefetch: int

    def _start_epochs(self, seed: int, window: int, virtual_shards: int | None) -> None:
        """Epoch 0 from its start, with this shuffle window and these virtual shards
        (None: the default for this global batch and world size)."""
        if window < 1:
            raise self.error(f"{self.path}: window_samples must be at least 1, got {window}")
        self.seed, self.window = seed, window
        self.virtual_shards = self._check_layout(
            virtual_shards or pt.default_virtual_shards(self.global_batch, self.world_size))
        self.epoch = 0
        self._position = 0
        self._stream_len = self._fresh_stream_len()
        self._resumed_epoch: int | None = None
        self._active: Prefetcher | Inline | None = None

    # -- layout -------------------------------------------------------------------------

    def _check_layout(self, virtual_shards: int) -> int:
        try:
            pt.check_virtual_shards(virtual_shards, self.global_batch, self.world_size)
        except pt.PartitionError as exc:
            raise self.error(
                f"{self.path}: {exc} (batch {self.batch_size} per rank x {self.world_size} ranks)"
            ) from exc
        return virtual_shards

    def _fresh_stream_len(self) -> int:
        return pt.stream_length(self.num_samples, self.global_batch, self.virtual_shards)

    @property
    def per_stream(self) -> int:
        """Samples each stream contributes to one global batch."""
        return self.global_batch // self.virtual_shards

    @property
    def steps_per_epoch(self) -> int:
        """Steps in a full epoch (the same on every rank)."""
        return pt.steps_per_epoch(self.num_samples, self.global_batch)

    @property
    def window_bytes(self) -> int:
        """Bytes of one shuffle window of this rank's streams (what a reader holds per
        window: the sample reader about two, the token reader one)."""
        streams = self.virtual_shards // self.world_size
        return streams * self.window * self.sample_bytes

    def __len__(self) -> int:
        """Steps remaining in the current epoch (the same on every rank)."""
        return pt.steps_remaining(self._stream_len, self._position, self.per_stream)

    def set_epoch(self, epoch: int) -> None:
        """Start epoch `epoch` at its beginning, unless a loaded state resumes inside it."""
        if epoch < 0:
            raise self.error(f"{self.path}: epoch must be non-negative, got {epoch}")
        self._stop_active()
        if self._resumed_epoch is not None and epoch == self._resumed_epoch:
            self._resumed_epoch = None
            return
        self._resumed_epoch = None
        self.epoch = epoch
        self._position = 0
        self._stream_len = self._fresh_stream_len()

    # -- state --------------------------------------------------------------------------

    def state_dict(self) -> dict[str, int]:
        """Where this epoch stands; independent of the global batch and world size."""
        return {
            "seed": self.seed,
            "epoch": self.epoch,
            "num_samples": self.num_samples,
            "block": self.block,
            "virtual_shards": self.virtual_shards,
            "stream_length": self._stream_len,
            "window": self.window,
            "position": self._position,
            "order": pt.ORDER_VERSION,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume where `state` left off; check it fits this file and this world size."""
        missing = [k for k in self.state_keys if k not in state]
        if missing:
            raise self.error(f"{self.path}: reader state lacks {', '.join(missing)}")
        st = {k: int(state[k]) for k in self.state_keys}
        self._check_state(st, int(state.get("order", self.unversioned_order)))
        self._stop_active()
        self.seed, self.epoch, self.window = st["seed"], st["epoch"], st["window"]
        self.virtual_shards = st["virtual_shards"]
        self._stream_len, self._position = st["stream_length"], st["position"]
        self._resumed_epoch = self.epoch

    def _check_state(self, st: dict[str, int], order: int) -> None:
        """Refuse a state that does not fit this file, world and batch (`order`: its order
        version), before any of it is adopted."""
        units = f"{self.unit}s"
        if st["num_samples"] != self.num_samples or st["block"] != self.block:
            raise self.error(
                f"{self.path}: the reader state is for {st['num_samples']} {units} in blocks of "
                f"{st['block']}, but the file has {self.num_samples} in blocks of {self.block}")
        v = st["virtual_shards"]
        if v < 1 or v % self.world_size or self.global_batch % v:
            raise self.error(
                f"{self.path}: cannot resume {v} virtual shards on {self.world_size} ranks with "
                f"batch {self.batch_size} per rank: the world size must divide {v} and the "
                f"global batch ({self.global_batch}) must be a multiple of {v}")
        if st["window"] < 1 or st["seed"] < 0 or st["epoch"] < 0:
            raise self.error(f"{self.path}: reader state has an invalid window, seed or epoch")
        if not (st["stream_length"] > 0 and st["stream_length"] * v <= self.num_samples):
            raise self.error(
                f"{self.path}: reader state stream length {st['stream_length']} x {v} streams "
                f"does not fit {self.num_samples} {units}")
        if order != pt.ORDER_VERSION and 0 < st["position"] < st["stream_length"]:
            raise self.error(
                f"{self.path}: the reader state is from mid-epoch under {self.unit} order "
                f"version {order}, but this hpcdp orders {units} by version {pt.ORDER_VERSION}: "
                f"resuming would repeat some {units} and skip others; resume from a checkpoint "
                "taken at the end of an epoch, or with the hpcdp version that wrote this one")
        if not 0 <= st["position"] <= st["stream_length"]:
            raise self.error(
                f"{self.path}: reader state position {st['position']} is outside its stream "
                f"of {st['stream_length']}")

    # -- serving ------------------------------------------------------------------------

    def _serve(self, items: Iterator[Any], steps: int, threaded: bool,
               thread_name: str = "hpcdp-reader") -> Iterator[Any]:
        """The pass's `steps` batches from `items`, built `prefetch` ahead in a thread or
        in the consumer's; the position counts what the consumer received."""
        self._stop_active()
        source: Prefetcher | Inline = (
            Prefetcher(items, self.prefetch, name=thread_name) if threaded else Inline(items))
        self._active = source
        return self._consume(source, steps)

    def _consume(self, source: Prefetcher | Inline, steps: int) -> Iterator[Any]:
        try:
            for _ in range(steps):
                # Checked before asking: a stopped source answers with its own error (a
                # closed generator, a prefetch thread gone), which would not say why.
                if self._active is not source:
                    raise self.error(f"{self.path}: the reader was reset while iterating")
                batch = source.get()
                # Count what the consumer received, not what the thread read ahead.
                self._position += self.per_stream
                yield batch
        finally:
            source.stop()
            if self._active is source:
                self._active = None

    def _stop_active(self) -> None:
        if self._active is not None:
            self._active.stop()
            self._active = None

    # -- life ---------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the prefetch thread (a reader also closes its file)."""
        self._stop_active()

    def __del__(self) -> None:
        if sys.is_finalizing():
            return  # HDF5 (and with parallel HDF5, MPI) may already be torn down
        with contextlib.suppress(Exception):
            self.close()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        """Pickle without the open file or thread (for spawned worker processes)."""
        state = dict(self.__dict__)
        state.update(dict.fromkeys(self.transient))
        return state
