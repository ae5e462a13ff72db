"""bf16 compression's arithmetic without collectives: the chunks, the wire format, and a
reduce-scatter plus allgather simulated for several ranks against the documented rule."""

from __future__ import annotations

import pytest
import torch

from hpcdp import config as cfgmod
from hpcdp import tasks
from hpcdp.config import ConfigError
from hpcdp.runtime import bf16_reduce as b
from hpcdp.runtime.hvd_settings import CPU_BUCKET_BYTES
from hpcdp.train.setup import bucket_bytes


def test_chunks_cover_the_bucket_in_rank_order() -> None:
    assert b.chunk_sizes(10, 3) == [4, 3, 3]
    assert b.chunk_sizes(2, 4) == [1, 1, 0, 0]
    assert sum(b.chunk_sizes(1_000_003, 7)) == 1_000_003


def test_the_wire_is_bf16_bits_rounded_to_nearest_even() -> None:
    # 1 + 2^-8 lies halfway between bf16's 1 and 1 + 2^-7: ties go to the even one (1);
    # 1 + 3 * 2^-8 lies halfway between 1 + 2^-7 and 1 + 2^-6: the even one is 1 + 2^-6.
    x = torch.tensor([1 + 2**-8, 1 + 3 * 2**-8, 3e38, -2.5])
    wire = b.to_wire(x)
    assert wire.dtype == torch.int16 and wire.element_size() == 2
    assert b.from_wire(wire).tolist() == [1.0, 1 + 2**-6, pytest.approx(3e38, rel=1e-2), -2.5]
    # bf16 keeps float32's range where fp16 overflows to inf
    assert torch.isfinite(b.from_wire(wire)).all() and not torch.isfinite(x.half()).all()


def documented(scaled: list[torch.Tensor]) -> torch.Tensor:
    """bf16(sum over ranks, in rank order, in float32, of bf16(each rank's scaled bucket))."""
    total = torch.zeros_like(scaled[0])
    for t in scaled:
        total += t.to(torch.bfloat16).float()
    return total.to(torch.bfloat16).float()


def simulate(buckets: list[torch.Tensor]) -> list[torch.Tensor]:
    """Every rank's result, the alltoall and allgather done by hand."""
    n = len(buckets)
    sizes = b.chunk_sizes(buckets[0].numel(), n)
    sent = [list(torch.split(b.to_wire(t), sizes)) for t in buckets]
    reduced = [b.reduce_received(torch.cat([sent[r][j] for r in range(n)]), n) for j in range(n)]
    gathered = b.from_wire(torch.cat(reduced))
    return [gathered.clone() for _ in range(n)]


@pytest.mark.parametrize("ranks", [2, 3, 5])
def test_the_result_is_the_documented_rounding(ranks: int) -> None:
    gen = torch.Generator().manual_seed(ranks)
    buckets = [torch.randn(1001, generator=gen) / ranks for _ in range(ranks)]
    want = documented(buckets)
    for got in simulate(buckets):
        assert torch.equal(got, want)
    exact = sum(t.double() for t in buckets)
    err = (want.double() - exact).abs().max().item()
    assert 0 < err <= 2 * 2**-8 * exact.abs().max().item() + 1e-6  # rounded, within bf16's


def build(*overrides: str) -> cfgmod.Config:
    return cfgmod.build(None, ["task.name=image", "data.path=data/x", *overrides],
                        tasks.defaults)


@pytest.mark.parametrize("override, needle", [
    ("horovod.op=adasum", "cannot be combined with horovod.op='adasum'"),
    ("horovod.bucket_mb=0", "needs hpcdp's gradient buckets"),
])
def test_what_bf16_cannot_travel_with_is_refused(override: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        build("horovod.compression=bf16", override)


def test_bf16_always_takes_the_buckets_gpus_included() -> None:
    cuda = torch.device("cuda")
    assert bucket_bytes(build("horovod.compression=bf16"), cuda) == CPU_BUCKET_BYTES
    assert bucket_bytes(build("horovod.compression=bf16", "horovod.bucket_mb=2"), cuda) == 2 << 20
    assert bucket_bytes(build("horovod.compression=fp16"), torch.device("cpu")) == 0
