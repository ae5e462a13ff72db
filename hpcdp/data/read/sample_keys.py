"""A training reader whose batches also carry each sample's (epoch, global index).

Augmentation keyed by the sample (`hpcdp.data.read.augment`) needs to know
which sample sits in each batch slot. The sharded readers' order is a pure
function of their state (`hpcdp.data.read.order.rank_order`), so this wrapper
computes the rows of the pass it is about to serve, from the same state the
reader snapshots when iteration starts, and hands them out beside the batches:
``(x, y, keys)`` with keys int64 of shape (b, 2). Everything else (epochs,
length, resume state) is the wrapped reader's.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from hpcdp.data.read import order as pt


class SampleKeys:
    """`reader` (a ShardedReader or FieldReader) with sample keys added to each batch."""

    def __init__(self, reader: Any) -> None:
        self.reader = reader

    def __getattr__(self, name: str) -> Any:
        return getattr(self.reader, name)

    def __len__(self) -> int:
        return len(self.reader)

    def rows(self) -> np.ndarray:
        """This rank's remaining batches of the current epoch as global rows (steps, b)."""
        r, st = self.reader, self.reader.state_dict()
        return pt.rank_order(r.num_samples, r.block, st["seed"], st["epoch"], r.global_batch,
                             st["virtual_shards"], st["window"], r.rank, r.world_size,
                             position=st["position"], stream_len=st["stream_length"])

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        rows = self.rows()  # before iterating: the reader's position moves as it serves
        epoch = self.reader.state_dict()["epoch"]
        inner = iter(self.reader)
        try:
            for j, batch in enumerate(inner):
                keys = np.empty((rows.shape[1], 2), np.int64)
                keys[:, 0] = epoch
                keys[:, 1] = rows[j]
                yield (*batch, torch.from_numpy(keys))
        finally:
            close = getattr(inner, "close", None)
            if close is not None:
                close()
