"""Which samples each rank reads, in which order, and where an epoch resumes.

Pure functions of integers, no I/O, so that the properties that keep training
correct (every sample once per epoch, equal steps per rank, an order that does
not depend on the number of ranks, exact resume) can be property-tested.

The layout of one epoch:

1. The file's blocks of ``block`` rows (the dataset's chunk rows, the unit of
   contiguous reads) are permuted by an RNG seeded from (seed, epoch). Their
   concatenation ``P`` is a sequence of sample indices made of contiguous runs.
2. ``steps = N // G`` for a global batch ``G``; the last ``N - steps*G`` samples
   of ``P`` (fewer than one global batch) are dropped. The rest is cut into
   ``V`` equal "streams" of ``S = steps*G // V`` samples.
3. Each stream is cut into windows of ``w`` samples; each window is shuffled by
   a permutation seeded from (seed, epoch, v, k).
4. Global step ``j`` takes positions ``[j*u, (j+1)*u)`` of every stream
   (``u = G // V``), streams in order. Rank ``r`` of ``W`` owns streams
   ``[r*V/W, (r+1)*V/W)``, which makes its batch exactly slice
   ``[r*b, (r+1)*b)`` of the global batch. Nothing depends on ``W``.
"""

from __future__ import annotations

import hashlib
import math
import struct
import threading
from collections.abc import Sequence

import numpy as np

Run = tuple[int, int]

#: Default number of streams divides 24 when possible: 24 has many divisors
#: (1, 2, 3, 4, 6, 8, 12, 24), so the same order serves many world sizes.
_STREAM_BASE = 24


class PartitionError(ValueError):
    """The requested layout is impossible (too few samples, sizes that do not divide)."""


#: The definition of the order below, saved with a reader's state: resuming mid-epoch
#: under another definition would repeat some samples and skip others.
#: 1: PCG64 seeded through SeedSequence; 2: PCG64 state from BLAKE2b of the key.
ORDER_VERSION = 2

_PER_THREAD = threading.local()


def _keyed_permutation(length: int, *key: int) -> np.ndarray:
    """A permutation of range(length) that depends only on the non-negative ints `key`.

    PCG64's 128-bit state and increment are taken from a BLAKE2b digest of the key
    and set on a generator kept per thread: the same stream SeedSequence would give
    in quality, at about a third of the cost of building a seeded generator (a
    reader draws one permutation per window and stream, tens per epoch).
    """
    digest = hashlib.blake2b(struct.pack(f"<{len(key)}Q", *key), digest_size=32,
                             person=b"hpcdp.order").digest()
    gen = getattr(_PER_THREAD, "gen", None)
    if gen is None:
        gen = _PER_THREAD.gen = np.random.Generator(np.random.PCG64(0))
    gen.bit_generator.state = {
        "bit_generator": "PCG64",
        "state": {"state": int.from_bytes(digest[:16], "little"),
                  "inc": int.from_bytes(digest[16:], "little") | 1},
        "has_uint32": 0, "uinteger": 0,
    }
    return gen.permutation(length)


def _check_nonneg(**values: int) -> None:
    for name, value in values.items():
        if value < 0:
            raise PartitionError(f"{name} must be non-negative, got {value}")


def num_blocks(num_samples: int, block: int) -> int:
    """Blocks of `block` rows covering `num_samples` (the last may be short)."""
    if block < 1:
        raise PartitionError(f"block must be at least 1, got {block}")
    return -(-num_samples // block)


def epoch_block_order(num_samples: int, block: int, seed: int, epoch: int) -> np.ndarray:
    """The permuted block indices of epoch `epoch`: the same on every rank and world size."""
    _check_nonneg(num_samples=num_samples, seed=seed, epoch=epoch)
    return _keyed_permutation(num_blocks(num_samples, block), seed, epoch)


def block_offsets(num_samples: int, block: int, order: np.ndarray) -> np.ndarray:
    """Start position in ``P`` of each permuted block, plus a final ``num_samples``."""
    lengths = np.minimum(block, num_samples - order.astype(np.int64) * block)
    return np.concatenate(([0], np.cumsum(lengths)))


def steps_per_epoch(num_samples: int, global_batch: int) -> int:
    """Full global batches in one epoch; the remainder (< one global batch) is dropped."""
    if global_batch < 1:
        raise PartitionError(f"global batch must be at least 1, got {global_batch}")
    steps = num_samples // global_batch
    if steps == 0:
        raise PartitionError(
            f"fewer samples than one global batch: {num_samples} samples, "
            f"global batch {global_batch}"
        )
    return steps


def stream_length(num_samples: int, global_batch: int, virtual_shards: int) -> int:
    """Samples per stream in a fresh epoch: ``steps * G // V``."""
    check_virtual_shards(virtual_shards, global_batch)
    return steps_per_epoch(num_samples, global_batch) * global_batch // virtual_shards


def default_virtual_shards(global_batch: int, world_size: int) -> int:
    """``lcm(gcd(G, 24), W)``: divides G, is a multiple of W, and is 24 for G=48, W | 24."""
    if world_size < 1 or global_batch % world_size:
        raise PartitionError(
            f"global batch {global_batch} is not a multiple of world size {world_size}"
        )
    return math.lcm(math.gcd(global_batch, _STREAM_BASE), world_size)


def check_virtual_shards(virtual_shards: int, global_batch: int, world_size: int = 1) -> int:
    """Validate V against G and W; return ``u = G // V`` (samples per stream per step)."""
    if virtual_shards < 1:
        raise PartitionError(f"virtual shards must be at least 1, got {virtual_shards}")
    if global_batch % virtual_shards:
        raise PartitionError(
            f"global batch {global_batch} is not a multiple of {virtual_shards} virtual shards"
        )
    if world_size < 1 or virtual_shards % world_size:
        raise PartitionError(
            f"{virtual_shards} virtual shards cannot be split evenly over {world_size} ranks"
        )
    return global_batch // virtual_shards


def rank_streams(virtual_shards: int, world_size: int, rank: int) -> range:
    """The streams rank `rank` reads: a contiguous range of ``V / W`` streams."""
    if virtual_shards % world_size:
        raise PartitionError(
            f"{virtual_shards} virtual shards cannot be split evenly over {world_size} ranks"
        )
    if not 0 <= rank < world_size:
        raise PartitionError(f"rank {rank} is outside a world of {world_size}")
    per = virtual_shards // world_size
    return range(rank * per, (rank + 1) * per)


def steps_remaining(stream_len: int, position: int, per_stream: int) -> int:
    """Whole steps left from `position` when each step takes `per_stream` from each stream."""
    return max(0, stream_len - position) // per_stream


def positions_to_runs(
    num_samples: int, block: int, order: np.ndarray, lo: int, hi: int,
    offsets: np.ndarray | None = None,
) -> list[Run]:
    """The file row ranges ``(start, stop)`` holding positions ``[lo, hi)`` of ``P``, in order.

    Adjacent ranges that happen to continue each other in the file are merged, so
    the caller issues as few contiguous reads as possible. `offsets` is
    `block_offsets(...)` for `order`, passed by callers that ask many times.
    """
    if not 0 <= lo <= hi <= num_samples:
        raise PartitionError(f"positions [{lo}, {hi}) outside 0..{num_samples}")
    if offsets is None:
        offsets = block_offsets(num_samples, block, order)
    runs: list[Run] = []
    i = int(np.searchsorted(offsets, lo, side="right")) - 1
    pos = lo
    while pos < hi:
        start_pos, end_pos = int(offsets[i]), int(offsets[i + 1])
        take_end = min(hi, end_pos)
        first_row = int(order[i]) * block + (pos - start_pos)
        last_row = first_row + (take_end - pos)
        if runs and runs[-1][1] == first_row:
            runs[-1] = (runs[-1][0], last_row)
        else:
            runs.append((first_row, last_row))
        pos = take_end
        i += 1
    return runs


def stream_runs(
    num_samples: int, block: int, order: np.ndarray, stream_len: int, stream: int, a: int, b: int,
    offsets: np.ndarray | None = None,
) -> list[Run]:
    """File row ranges holding positions ``[a, b)`` of stream `stream` (before window shuffle)."""
    if not 0 <= a <= b <= stream_len:
        raise PartitionError(f"stream positions [{a}, {b}) outside 0..{stream_len}")
    base = stream * stream_len
    return positions_to_runs(num_samples, block, order, base + a, base + b, offsets)


def window_bounds(stream_len: int, window: int, k: int) -> Run:
    """Positions ``[start, stop)`` of window `k` of a stream (the last may be short)."""
    if window < 1:
        raise PartitionError(f"window must be at least 1 sample, got {window}")
    start = k * window
    return start, min(stream_len, start + window)


def window_permutation(seed: int, epoch: int, stream: int, k: int, length: int) -> np.ndarray:
    """The shuffle of window `k` of stream `stream`: entry i is the offset read at position i."""
    return _keyed_permutation(length, seed, epoch, stream, k)


def runs_to_indices(runs: Sequence[Run]) -> np.ndarray:
    """Expand row ranges into sample indices (for tests and small checks)."""
    if not runs:
        return np.zeros(0, dtype=np.int64)
    return np.concatenate([np.arange(s, e, dtype=np.int64) for s, e in runs])


def stream_order(
    num_samples: int, block: int, seed: int, epoch: int, stream_len: int, stream: int, window: int
) -> np.ndarray:
    """All sample indices of one stream, window-shuffled, in the order they are served."""
    order = epoch_block_order(num_samples, block, seed, epoch)
    out = []
    for k in range(-(-stream_len // window)):
        a, b = window_bounds(stream_len, window, k)
        idx = runs_to_indices(stream_runs(num_samples, block, order, stream_len, stream, a, b))
        out.append(idx[window_permutation(seed, epoch, stream, k, b - a)])
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


def global_order(
    num_samples: int,
    block: int,
    seed: int,
    epoch: int,
    global_batch: int,
    virtual_shards: int,
    window: int,
    position: int = 0,
    stream_len: int | None = None,
) -> np.ndarray:
    """The global batches, shape ``(steps, G)``, from stream `position` on.

    `stream_len` is the epoch's stream length (stored in a resume state); by
    default that of a fresh epoch with this global batch. Used by tests: the
    result does not involve the world size at all: it is what one rank owning
    every stream reads.
    """
    return rank_order(num_samples, block, seed, epoch, global_batch, virtual_shards, window,
                      rank=0, world_size=1, position=position, stream_len=stream_len)


def rank_order(
    num_samples: int,
    block: int,
    seed: int,
    epoch: int,
    global_batch: int,
    virtual_shards: int,
    window: int,
    rank: int,
    world_size: int,
    position: int = 0,
    stream_len: int | None = None,
) -> np.ndarray:
    """Rank `rank`'s batches, shape ``(steps, b)``, built only from the streams it owns."""
    per = check_virtual_shards(virtual_shards, global_batch, world_size)
    if stream_len is None:
        stream_len = stream_length(num_samples, global_batch, virtual_shards)
    steps = steps_remaining(stream_len, position, per)
    parts = [
        stream_order(num_samples, block, seed, epoch, stream_len, v, window)[
            position : position + steps * per
        ].reshape(steps, per)
        for v in rank_streams(virtual_shards, world_size, rank)
    ]
    return np.concatenate(parts, axis=1)
