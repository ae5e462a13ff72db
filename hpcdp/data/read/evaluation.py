"""Every sample of a file exactly once over the ranks, in file order: for evaluation.

Rank r of W reads rows [r*N//W, (r+1)*N//W) in batches of `batch_size` (its last
batch may be short), so N samples are scored once on any number of ranks. Ranks
then hold counts that differ by at most one and may take one batch more or less:
whoever iterates must not run a collective per batch (sum at the end instead).
Contiguous slab reads, no shuffling, no background thread: evaluation data is
read once per epoch.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence

import numpy as np
import torch

from hpcdp.data.read.samples import ReaderError, open_h5


def rank_rows(num_samples: int, rank: int, world_size: int) -> tuple[int, int]:
    """This rank's rows [start, stop): contiguous, sizes differ by at most one (pure)."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside a world of {world_size}")
    return rank * num_samples // world_size, (rank + 1) * num_samples // world_size


class SliceReader:
    """This rank's contiguous share of `names` (datasets of equal length) in `path`."""

    def __init__(self, path: str | os.PathLike[str], names: Sequence[str], *, batch_size: int,
                 rank: int = 0, world_size: int = 1) -> None:
        self.path = os.fspath(path)
        if batch_size < 1:
            raise ReaderError(f"{self.path}: batch_size must be at least 1, got {batch_size}")
        self.names = tuple(names)
        self.batch_size = batch_size
        self._file = open_h5(self.path)  # kept open: see hpcdp.train.setup (readers live on)
        lengths = {n: int(self._file[n].shape[0]) for n in self.names}
        if len(set(lengths.values())) != 1:
            raise ReaderError(f"{self.path}: datasets of different lengths: {lengths}")
        self.num_samples = lengths[self.names[0]]
        self.start, self.stop = rank_rows(self.num_samples, rank, world_size)

    @property
    def sample_shape(self) -> tuple[int, ...]:
        return tuple(int(d) for d in self._file[self.names[0]].shape[1:])

    def __len__(self) -> int:
        """Batches this rank reads (ranks may differ by one)."""
        return -(-(self.stop - self.start) // self.batch_size)

    def __iter__(self) -> Iterator[tuple[torch.Tensor | None, ...]]:
        """Batches shaped as ShardedReader's: one tensor per name, `(x, None)` for one name."""
        dsets = [self._file[n] for n in self.names]
        for a in range(self.start, self.stop, self.batch_size):
            b = min(self.stop, a + self.batch_size)
            batch = tuple(torch.from_numpy(np.ascontiguousarray(d[a:b])) for d in dsets)
            yield batch if len(batch) > 1 else (batch[0], None)
