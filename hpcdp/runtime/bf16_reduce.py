"""A flat float32 bucket averaged over ranks with bfloat16 on the wire.

Horovod 0.28.1 all-reduces no bfloat16 tensor (its tensor types stop at float16, on
MPI, Gloo and NCCL alike), so the bucket is reduce-scattered and all-gathered here,
in bf16 bits viewed as int16, which every Horovod build moves unchanged:

1. each rank rounds its bucket (already pre-scaled, by 1/ranks by default) to bf16,
   to nearest even, and an alltoall sends chunk j of it to rank j (chunk sizes differ
   by at most 1);
2. rank j adds the chunks it received in float32, in rank order, and rounds the
   sum to bf16: it alone reduces chunk j;
3. an allgather hands every owner's reduced chunk to every rank, so all ranks hold
   the same bits; they are widened to float32 and multiplied by the post-scale.

So the average is bf16(sum over ranks r, in order, of bf16(g_r / ranks)), the sum in
float32 (with horovod.gradient_predivide_factor f: g_r / f, and the result times f / ranks).

Bytes: a rank hands its whole bucket to the alltoall (2 bytes an element) and its
chunk to the allgather; on the wire it sends 2N(n-1)/n bytes in each, together what
fp16 compression's ring all-reduce sends, half of float32's. Both collectives are
Horovod's own, which hpcdp's patches leave as they are: a stock build runs them.
"""

from __future__ import annotations

from typing import Any

import torch


def chunk_sizes(elements: int, ranks: int) -> list[int]:
    """How many elements of a bucket each rank reduces: in rank order, the first
    `elements % ranks` ranks one more."""
    base, extra = divmod(elements, ranks)
    return [base + (1 if r < extra else 0) for r in range(ranks)]


def to_wire(values: torch.Tensor) -> torch.Tensor:
    """float32 -> bf16 (round to nearest even) -> its bits as int16, the wire format."""
    return values.to(torch.bfloat16).view(torch.int16)


def from_wire(bits: torch.Tensor) -> torch.Tensor:
    return bits.view(torch.bfloat16).float()


def reduce_received(received: torch.Tensor, ranks: int) -> torch.Tensor:
    """This rank's chunk from the `ranks` chunks it received (rank order), summed in
    float32 in that order, on the wire again."""
    parts = from_wire(received).view(ranks, -1)
    total = parts[0].clone()
    for r in range(1, ranks):
        total += parts[r]
    return to_wire(total)


class Exchange:
    """One bucket's two collectives: `start` (the constructor) sends the alltoall,
    `gather` reduces this rank's chunk and starts the allgather, `finish` writes the
    average into the bucket. Every bucket's `gather` may come before any `finish`."""

    def __init__(self, hvd: Any, bucket: torch.Tensor, name: str) -> None:
        self._hvd, self._bucket, self._name = hvd, bucket, name
        self._ranks = hvd.size()
        splits = torch.tensor(chunk_sizes(bucket.numel(), self._ranks), dtype=torch.int32)
        self._handle = hvd.alltoall_async(to_wire(bucket), splits=splits, name=name)
        self._gathering: Any = None

    def gather(self) -> None:
        received, _ = self._hvd.synchronize(self._handle)
        mine = reduce_received(received, self._ranks)
        self._gathering = self._hvd.allgather_async(mine, name=f"{self._name}.gather")

    def finish(self, postscale: float) -> None:
        if self._gathering is None:
            self.gather()
        self._bucket.copy_(from_wire(self._hvd.synchronize(self._gathering)))
        if postscale != 1.0:
            self._bucket.mul_(postscale)
