"""Flat gradient buckets average exactly what Horovod's DistributedOptimizer averages.

Each rank trains two copies of one model on its own data, one through
`hpcdp.runtime.grad_buckets.bucketed`, one through `hvd.DistributedOptimizer`, and
checks after every step that the parameters agree (and are the same on every
rank). Covers accumulation over backward passes, a parameter no forward pass
uses (its bucket is reduced by synchronize(), not by a hook: no rank waits),
the GradScaler-style synchronize/skip_synchronize pattern, the predivide
factor, torch's fused SGD kernel, and the flag the last bucket carries for the
preemption check (any rank's 1 reaches every rank, at the step it was sent
with). Any mismatch
raises: the rank exits non-zero and the run fails.
"""

from __future__ import annotations

import horovod.torch as hvd
import torch
from torch import nn

from hpcdp.runtime.grad_buckets import bucketed


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(6, 32)
        self.b = nn.Linear(32, 32)
        self.c = nn.Linear(32, 3)
        self.unused = nn.Linear(4, 4)  # never in forward

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(torch.relu(self.b(torch.relu(self.a(x)))))


def flat(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def run(accum: int, bucket_bytes: int, predivide: float, split_step: bool,
        set_to_none: bool = True, fused: bool | None = None) -> None:
    r = hvd.rank()
    torch.manual_seed(3)
    ours, ref = Net(), Net()
    ref.load_state_dict(ours.state_dict())
    opt = bucketed(torch.optim.SGD(ours.parameters(), lr=0.1, momentum=0.9, fused=fused),
                   bucket_bytes, accum, predivide)
    # The wrapper is a new optimizer built from the groups: torch's kernel choice goes along.
    assert all(g["fused"] is fused for g in opt.param_groups), opt.param_groups
    assert len(opt.buckets) > 1 or bucket_bytes > 10_000, opt.buckets
    ref_opt = hvd.DistributedOptimizer(
        torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9),
        named_parameters=ref.named_parameters(), backward_passes_per_step=accum,
        gradient_predivide_factor=predivide)
    gen = torch.Generator().manual_seed(100 + r)  # each rank its own data
    start = flat(ours)
    for step in range(6):
        # The flag rides with this step's last bucket: one rank raises it at step 3 only.
        carried = opt.carry_max(1 if (step == 3 and r == hvd.size() - 1) else 0)
        opt.zero_grad(set_to_none=set_to_none)  # False: backward adds into the views
        ref_opt.zero_grad()  # (Horovod's takes no argument)
        for _ in range(accum):
            x = torch.randn(8, 6, generator=gen)
            for model in (ours, ref):
                (model(x).pow(2).mean() / accum).backward()
        if split_step:  # as hpcdp trains: synchronize, look at gradients, then step
            opt.synchronize()
            ref_opt.synchronize()
            with opt.skip_synchronize(), ref_opt.skip_synchronize():
                opt.step()
                ref_opt.step()
        else:
            opt.step()
            ref_opt.step()
        flag = carried()
        assert flag == (1 if step == 3 else 0), f"step {step}: rank {r} read flag {flag}"
        got, want = flat(ours), flat(ref)
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-6), (
            f"step {step} (accum {accum}, buckets {opt.buckets}): max diff "
            f"{(got - want).abs().max().item()}")
        everyone = hvd.allgather(got.unsqueeze(0), name=f"params.{accum}.{bucket_bytes}.{step}")
        assert all(torch.equal(everyone[0], row) for row in everyone), "ranks differ"
    assert not torch.equal(start, flat(ours)), "nothing was trained"
    assert opt.carry_max(1)() == 0, "a flag read before its step synchronized"
    # The unused layer's gradient is reduced as zeros (as Horovod does): momentum stays 0.
    assert torch.count_nonzero(ours.unused.weight.grad) == 0


def main() -> None:
    hvd.init()
    assert hvd.size() >= 2, f"expected several ranks, got {hvd.size()}"
    run(accum=1, bucket_bytes=2048, predivide=1.0, split_step=False)
    run(accum=2, bucket_bytes=2048, predivide=1.0, split_step=True)
    run(accum=1, bucket_bytes=1 << 20, predivide=2.0, split_step=True)
    run(accum=2, bucket_bytes=4096, predivide=1.0, split_step=False, set_to_none=False)
    run(accum=1, bucket_bytes=2048, predivide=1.0, split_step=True, fused=True)
    emb = nn.Embedding(10, 4, sparse=True)
    bucketed(torch.optim.SGD(emb.parameters(), lr=0.1), 1024)
    try:
        emb(torch.tensor([1, 2])).sum().backward()
    except RuntimeError as e:
        assert "sparse gradient" in str(e) and "bucket_mb=0" in str(e), e
    else:
        raise AssertionError("a sparse gradient was taken into a flat bucket")
    print(f"rank {hvd.rank()}: grad buckets agree with DistributedOptimizer", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
