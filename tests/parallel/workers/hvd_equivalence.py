"""The collectives hpcdp and its users call give reference results (any build, any
controller, any number of ranks).

Every rank makes every rank's input from a seed of that rank, so each can
compute the reference (NumPy/torch on one process) itself: all-reduce (sum,
average, min, max) and grouped all-reduce, allgather of unequal parts,
broadcast from a root other than 0, alltoall with unequal splits, and a sparse
embedding gradient that DistributedOptimizer allgathers. Exact where the
operation is (integers, min/max, gathers and copies, and float sums of two
ranks); float sums of more ranks to within rounding, since the order of the
additions is the algorithm's. Results of reductions must also have the same
bits on every rank. Run by hvd_ops.py, so on every launcher it runs on.
"""

from __future__ import annotations

import zlib

import horovod.torch as hvd
import torch


def rank_input(rank: int, what: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    gen = torch.Generator().manual_seed(zlib.crc32(f"{rank}:{what}".encode()))
    if dtype.is_floating_point:
        return torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)
    low = 0 if dtype == torch.uint8 else -1000
    return torch.randint(low, 100 if dtype == torch.uint8 else 1000, shape, generator=gen,
                         dtype=dtype)


def same_on_every_rank(t: torch.Tensor, what: str) -> None:
    flat = t.detach().contiguous().view(-1)
    bits = flat.view(torch.int16 if flat.element_size() == 2 else
                     torch.int32 if flat.element_size() == 4 else torch.int64)
    everyone = hvd.allgather(bits.unsqueeze(0), name=f"eq.bits.{what}")
    for i in range(hvd.size()):
        assert torch.equal(everyone[i], everyone[0]), f"{what}: rank {i}'s bits differ from 0's"


def assert_matches(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    if got.dtype.is_floating_point and hvd.size() > 2:
        torch.testing.assert_close(got, want, msg=lambda m: f"{what}: {m}")
    else:
        assert torch.equal(got, want), f"{what}: {got.flatten()[:4]} != {want.flatten()[:4]}"


def check_allreduce() -> None:
    n, r = hvd.size(), hvd.rank()
    for dtype in (torch.float32, torch.float64, torch.int32, torch.int64):
        for elems in (5, 70_000):  # small, and larger than 256 KiB in 4-byte types
            what = f"allreduce.{dtype}.{elems}"
            inputs = [rank_input(i, what, (elems,), dtype) for i in range(n)]
            stacked = torch.stack(inputs)
            ops = {"sum": (hvd.Sum, stacked.sum(0)), "min": (hvd.Min, stacked.min(0).values),
                   "max": (hvd.Max, stacked.max(0).values)}
            if dtype.is_floating_point:
                ops["average"] = (hvd.Average, stacked.sum(0) / n)
            for op_name, (op, want) in ops.items():
                got = hvd.allreduce(inputs[r], op=op, name=f"{what}.{op_name}")
                same_on_every_rank(got, f"{what}.{op_name}")
                if op_name == "average" and n == 2:  # sum, then a scale: one more rounding
                    torch.testing.assert_close(got, want)
                else:
                    assert_matches(got, want, f"{what}.{op_name}")


def check_grouped_allreduce() -> None:
    n, r = hvd.size(), hvd.rank()
    shapes = [((3, 4), torch.float32), ((1000,), torch.float64), ((7,), torch.int64),
              ((2, 2, 2), torch.float32)]
    inputs = [[rank_input(i, f"grouped.{k}", shape, dtype) for k, (shape, dtype)
               in enumerate(shapes)] for i in range(n)]
    got = hvd.grouped_allreduce(inputs[r], op=hvd.Sum, name="eq.grouped")
    for k, tensor in enumerate(got):
        want = torch.stack([inputs[i][k] for i in range(n)]).sum(0)
        same_on_every_rank(tensor, f"grouped.{k}")
        assert_matches(tensor, want, f"grouped allreduce, tensor {k}")


def check_allgather() -> None:
    n, r = hvd.size(), hvd.rank()
    for dtype in (torch.float32, torch.int64, torch.uint8):
        parts = [rank_input(i, f"gather.{dtype}", (2 * i + 1, 3), dtype) for i in range(n)]
        got = hvd.allgather(parts[r], name=f"eq.allgather.{dtype}")
        assert torch.equal(got, torch.cat(parts)), f"allgather {dtype}"


def check_broadcast() -> None:
    n, r = hvd.size(), hvd.rank()
    root = n - 1
    for dtype in (torch.float64, torch.int32):
        mine = rank_input(r, f"bcast.{dtype}", (50,), dtype)
        got = hvd.broadcast(mine, root_rank=root, name=f"eq.broadcast.{dtype}")
        assert torch.equal(got, rank_input(root, f"bcast.{dtype}", (50,), dtype)), \
            f"broadcast {dtype} from rank {root}"


def check_alltoall() -> None:
    """Rank i sends rank j (i + j + 1) rows holding 100 * i + j."""
    n, r = hvd.size(), hvd.rank()
    rows = [torch.full((r + j + 1, 2), 100 * r + j, dtype=torch.int64) for j in range(n)]
    splits = torch.tensor([r + j + 1 for j in range(n)], dtype=torch.int32)
    got, received = hvd.alltoall(torch.cat(rows), splits=splits, name="eq.alltoall")
    want = torch.cat([torch.full((i + r + 1, 2), 100 * i + r, dtype=torch.int64)
                      for i in range(n)])
    assert torch.equal(got, want), f"alltoall: {got[:, 0].tolist()}"
    assert received.tolist() == [i + r + 1 for i in range(n)], f"alltoall splits: {received}"


def embedding_model() -> torch.nn.Module:
    torch.manual_seed(5)
    return torch.nn.Sequential(torch.nn.Embedding(20, 4, sparse=True))


def embedding_batch(rank: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(300 + rank)
    return torch.randint(0, 20, (6,), generator=gen)


def check_sparse_allgather() -> None:
    """A sparse gradient goes through DistributedOptimizer as an allgather of its indices
    and values (sparse_as_dense off): the step equals one on the average of every
    rank's gradient."""
    n, r = hvd.size(), hvd.rank()
    model = embedding_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.5),
                                   named_parameters=model.named_parameters(), op=hvd.Average)
    opt.zero_grad()
    model(embedding_batch(r)).pow(2).sum().backward()
    assert model[0].weight.grad.is_sparse
    opt.step()
    ref = embedding_model()
    grads = []
    for i in range(n):
        ref.zero_grad()
        ref(embedding_batch(i)).pow(2).sum().backward()
        grads.append(ref[0].weight.grad.to_dense())
    with torch.no_grad():
        want = embedding_model()[0].weight - 0.5 * torch.stack(grads).sum(0) / n
    got = model[0].weight.detach()
    same_on_every_rank(got, "sparse.step")
    torch.testing.assert_close(got, want, msg=lambda m: f"sparse allgather step: {m}")
    assert not torch.equal(got, embedding_model()[0].weight), "the step changed nothing"


def run_all() -> None:
    check_allreduce()
    check_grouped_allreduce()
    check_allgather()
    check_broadcast()
    check_alltoall()
    check_sparse_allgather()
