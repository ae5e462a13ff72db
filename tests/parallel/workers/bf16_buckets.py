"""Average one step's gradients in bf16 buckets (hpcdp.runtime.grad_buckets, bf16=True)
on every rank, and check the result against the documented rounding
(hpcdp.runtime.bf16_reduce) from every rank's gradients, bit for bit.

Prints `bf16-buckets ok <buckets>` on rank 0 when every rank holds the documented bits.
"""

from __future__ import annotations

import sys

import horovod.torch as hvd
import torch

from hpcdp.runtime.grad_buckets import bucketed


def documented(grads: torch.Tensor, ranks: int) -> torch.Tensor:
    """bf16(float32 sum in rank order of bf16(g_r / ranks)): written out, not imported."""
    total = torch.zeros_like(grads[0])
    for r in range(ranks):
        total += (grads[r] / ranks).to(torch.bfloat16).float()
    return total.to(torch.bfloat16).float()


def main() -> int:
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(37, 23), torch.nn.Linear(23, 5))
    opt = bucketed(torch.optim.SGD(model.parameters(), lr=0.1), bucket_bytes=400, bf16=True)
    gen = torch.Generator().manual_seed(100 + rank)
    for p in model.parameters():
        g = torch.randn(p.shape, generator=gen)
        g.view(-1)[:3] = torch.tensor([3e36, -1e-30, 70000.0])  # past fp16's range both ways
        p.grad = g
    mine = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    everyone = hvd.allgather(mine.unsqueeze(0), name="test.raw")
    opt.synchronize()
    got = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    want = documented(everyone, size)
    if not torch.equal(got, want):
        bad = int((got != want).sum())
        raise SystemExit(f"rank {rank}: {bad} of {got.numel()} elements differ from the rule")
    results = hvd.allgather(got.unsqueeze(0), name="test.results")
    if not all(torch.equal(results[0], results[r]) for r in range(size)):
        raise SystemExit("the ranks' averaged gradients differ")
    if not torch.isfinite(got).all():
        raise SystemExit("an average overflowed")
    if rank == 0:
        print(f"bf16-buckets ok {len(opt.buckets)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
