"""Horovod's collectives behave correctly on this build (run on several ranks).

Every rank checks the results it receives; any mismatch raises, which makes
this rank exit non-zero and the launcher fail the run.
"""

from __future__ import annotations

import math

import horovod.torch as hvd
import hvd_equivalence  # beside this script
import torch


def check_allreduce() -> None:
    n, r = hvd.size(), hvd.rank()
    total = n * (n - 1) / 2  # sum of the ranks
    for dtype in (torch.float32, torch.float64, torch.float16, torch.int32, torch.int64):
        t = torch.full((1000,), r + 1, dtype=dtype)
        summed = hvd.allreduce(t, op=hvd.Sum, name=f"sum.{dtype}")
        expected = torch.full((1000,), total + n, dtype=dtype)
        assert torch.equal(summed, expected), f"Sum {dtype}: {summed[:4]} != {expected[:4]}"
        if dtype.is_floating_point:
            avg = hvd.allreduce(t, op=hvd.Average, name=f"avg.{dtype}")
            want = torch.full((1000,), (total + n) / n, dtype=dtype)
            assert torch.allclose(avg.double(), want.double()), f"Average {dtype}: {avg[:4]}"
    inplace = torch.arange(8, dtype=torch.float32) * (r + 1)
    hvd.allreduce_(inplace, op=hvd.Sum, name="inplace")
    want = torch.arange(8, dtype=torch.float32) * (total + n)
    assert torch.equal(inplace, want), f"in-place allreduce_: {inplace}"
    for op, want_val in ((hvd.Min, 1), (hvd.Max, n)):
        got = hvd.allreduce(torch.tensor([r + 1]), op=op, name=f"minmax.{op}")
        assert got.item() == want_val, f"{op}: {got.item()} != {want_val}"


def check_allreduce_agrees() -> None:
    """Sums of random floats: every rank gets the same bits, the sum of every rank's
    input, below and above the size where hpcdp's Horovod build changes algorithm
    between two ranks under Gloo (one exchange up to 256 KiB, then Gloo's ring)."""
    n, r = hvd.size(), hvd.rank()
    for elems in (7, 60_000, 100_000):  # 28 B, 240 KB, 400 KB
        inputs = [torch.randn(elems, generator=torch.Generator().manual_seed(1000 * i + elems))
                  for i in range(n)]
        got = hvd.allreduce(inputs[r], op=hvd.Sum, name=f"agree.{elems}")
        everyone = hvd.allgather(got.unsqueeze(0), name=f"agree.{elems}.results")
        for i in range(n):
            assert torch.equal(everyone[i], got), f"{elems} floats: rank {i} got other bits"
        want = torch.stack(inputs).sum(0)
        if n == 2:  # a + b, whatever the algorithm
            assert torch.equal(got, want), f"{elems} floats: {got[:3]} != {want[:3]}"
        torch.testing.assert_close(got, want)
    product = hvd.allreduce(torch.tensor([r + 2, -1]), op=hvd.Product, name="product")
    want = torch.tensor([math.prod(range(2, n + 2)), (-1) ** n])
    assert torch.equal(product, want), f"Product: {product} != {want}"


def check_allgather() -> None:
    r, n = hvd.rank(), hvd.size()
    # Each rank contributes a different number of rows: allgather concatenates along dim 0.
    part = torch.full((r + 1, 3), r, dtype=torch.int64)
    got = hvd.allgather(part, name="gather")
    want = torch.cat([torch.full((i + 1, 3), i, dtype=torch.int64) for i in range(n)])
    assert torch.equal(got, want), f"allgather: {got.tolist()}"
    objs = hvd.allgather_object({"rank": r})
    assert [o["rank"] for o in objs] == list(range(n)), f"allgather_object: {objs}"


def check_broadcast() -> None:
    r = hvd.rank()
    t = torch.full((5,), float(r))
    got = hvd.broadcast(t, root_rank=0, name="bcast")
    assert torch.equal(got, torch.zeros(5)), f"broadcast: {got}"
    obj = hvd.broadcast_object({"from": r, "payload": list(range(r, r + 3))}, root_rank=0)
    assert obj == {"from": 0, "payload": [0, 1, 2]}, f"broadcast_object: {obj}"


def make_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 2))


def check_broadcast_state() -> None:
    r = hvd.rank()
    model = make_model(seed=100 + r)  # deliberately different on each rank
    opt = torch.optim.Adam(model.parameters(), lr=0.01 * (r + 1))
    # One step so Adam has per-parameter state (exp_avg...) that differs by rank.
    model(torch.randn(4, 6)).sum().backward()
    opt.step()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    ref = make_model(seed=100)
    ref_opt = torch.optim.Adam(ref.parameters(), lr=0.01)
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    gathered = hvd.allgather(flat.unsqueeze(0), name="params.after.bcast")
    assert torch.equal(gathered[0], gathered[-1]), "parameters differ after broadcast"
    assert opt.param_groups[0]["lr"] == ref_opt.param_groups[0]["lr"], "lr not broadcast"
    states = [opt.state[p]["exp_avg"].flatten() for p in model.parameters()]
    flat_state = torch.cat(states).unsqueeze(0)
    gathered_state = hvd.allgather(flat_state, name="optstate.after.bcast")
    assert torch.equal(gathered_state[0], gathered_state[-1]), "optimizer state differs"


def check_distributed_optimizer() -> None:
    r, n = hvd.rank(), hvd.size()
    model = make_model(seed=7 + r)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    dopt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    gen = torch.Generator().manual_seed(1234 + r)  # different data on each rank
    for _ in range(5):
        x = torch.randn(8, 6, generator=gen)
        dopt.zero_grad()
        model(x).pow(2).mean().backward()
        dopt.step()
    flat = torch.cat([p.detach().flatten() for p in model.parameters()]).unsqueeze(0)
    gathered = hvd.allgather(flat, name="params.after.training")
    for i in range(1, n):
        assert torch.equal(gathered[0], gathered[i]), f"rank {i} parameters differ from rank 0"
    # The averaged gradient must really mix ranks: a model trained on rank 0's
    # data alone would end elsewhere.
    solo = make_model(seed=7)
    solo_opt = torch.optim.SGD(solo.parameters(), lr=0.1, momentum=0.9)
    gen0 = torch.Generator().manual_seed(1234)
    for _ in range(5):
        x = torch.randn(8, 6, generator=gen0)
        solo_opt.zero_grad()
        solo(x).pow(2).mean().backward()
        solo_opt.step()
    solo_flat = torch.cat([p.detach().flatten() for p in solo.parameters()])
    assert not torch.allclose(solo_flat, gathered[0]), "gradients were not averaged across ranks"


def main() -> None:
    hvd.init()
    assert hvd.size() >= 2, f"expected several ranks, got size {hvd.size()}"
    check_allreduce()
    check_allreduce_agrees()
    check_allgather()
    check_broadcast()
    check_broadcast_state()
    check_distributed_optimizer()
    hvd_equivalence.run_all()
    hvd.join()
    print(f"rank {hvd.rank()}/{hvd.size()}: all Horovod checks passed", flush=True)


if __name__ == "__main__":
    main()
