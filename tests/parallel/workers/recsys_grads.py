"""Train the click model on 2 ranks under both gradient modes and alone with twice the batch.

From the same start and the same global batches (rank r takes slice r of each):
- ``sparse``: tables averaged by Horovod's allgather of sparse gradients;
- ``dense``: tables averaged as dense tensors (``sparse_as_dense``);
- ``single``: one process, no Horovod, the whole global batch.
Rank 0 writes the largest parameter differences and the bytes per step as JSON;
every rank checks that all ranks hold the same parameters.
"""

from __future__ import annotations

import argparse
import json
import sys

import horovod.torch as hvd
import torch

from hpcdp.data.prep.clicks import synth as ck
from hpcdp.models.dlrm import DLRM, loss_fn, make_optimizers, split_params
from hpcdp.runtime import sparse_grads as grads

EMBED = 8
#: Tables of the test model: the user, the item, a side and a context field (the paths do not
#: depend on how many tables there are; every table costs two all-gathers a step).
COLUMNS = [0, 1, 2, 14]


def data(steps: int, global_batch: int) -> tuple[ck.ClickWorld, list[torch.Tensor]]:
    spec = ck.ClickSpec(rows=steps * global_batch, val_rows=0, seed=1, users=200, items=100,
                        max_table=3000)
    world = ck.ClickWorld(spec).calibrate()
    rows = world.rows("train", 0, spec.rows)
    return world, [torch.from_numpy(rows.dense), torch.from_numpy(rows.sparse[:, COLUMNS]),
                   torch.from_numpy(rows.label)]


def fresh(sizes: list[int]) -> DLRM:
    torch.manual_seed(0)
    return DLRM(13, sizes, embed_dim=EMBED, bottom=(16,), top=(16,))


def train(mode: str, sizes: list[int], tensors: list[torch.Tensor], steps: int, batch: int,
          rank: int, world: int, table_opt: str = "adagrad") -> tuple[torch.Tensor, list[int]]:
    """Final parameters (flattened) and this rank's table payload per step."""
    model = fresh(sizes)
    sparse_opt, dense_opt = make_optimizers(model, table_opt, 0.05, 1e-3)
    if mode != "single":
        tables, rest = split_params(model)
        grads.coalesce_table_grads(tables)
        sparse_opt, dense_opt = grads.distribute(tables, rest, sparse_opt, dense_opt, mode)
    payloads = []
    for step in range(steps):
        lo = step * batch * world + rank * batch
        dense, ids, label = (t[lo : lo + batch] for t in tensors)
        sparse_opt.zero_grad()
        dense_opt.zero_grad()
        loss_fn(model(dense, ids), label).backward()
        if mode != "single":
            # Horovod's sparse path hands back a function that builds the gathered gradient;
            # its all-reduce (sparse_as_dense) a handle number.
            kinds = {callable(h) for h, _ in sparse_opt._handles.values()}
            assert kinds == {mode == "sparse"}, f"{mode}: Horovod took another path"
            payloads.append(grads.table_payload(mode, grads.unique_rows(ids), sizes, EMBED))
        sparse_opt.step()
        dense_opt.step()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return flat, payloads


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--batch", type=int, default=32, help="per rank")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    hvd.init()
    torch.set_num_threads(1)
    rank, size = hvd.rank(), hvd.size()
    world, tensors = data(args.steps, args.batch * size)
    sizes = [world.sizes[c] for c in COLUMNS]
    start = torch.cat([q.detach().reshape(-1) for q in fresh(sizes).parameters()])
    results, sent = {}, {}
    for mode in grads.GRAD_MODES:
        results[mode], payloads = train(mode, sizes, tensors, args.steps, args.batch, rank, size)
        every = hvd.allgather_object(payloads, name=f"payloads.{mode}")
        mlp = sum(q.numel() * 4 for _, q in split_params(fresh(sizes))[1])
        per_step = [grads.bytes_sent_per_rank(mode, [e[s] for e in every], mlp)
                    for s in range(args.steps)]
        sent[mode] = {"payload_per_rank": sum(payloads) / len(payloads),
                      "bytes_sent_per_rank": sum(per_step) / len(per_step)}
        same = hvd.allgather_object(results[mode].numpy().tobytes(), name=f"same.{mode}")
        assert all(s == same[0] for s in same), f"{mode}: ranks hold different parameters"
    results["single"], _ = train("single", sizes, tensors, args.steps, args.batch * size, 0, 1)
    # SparseAdam too: Horovod hands the dense mode's average back as a sparse gradient.
    for mode in grads.GRAD_MODES:
        results[f"adam_{mode}"], _ = train(mode, sizes, tensors, args.steps, args.batch, rank,
                                           size, "sparse_adam")
    # Control: one process with the per-rank batch takes other steps.
    results["half"], _ = train("single", sizes, tensors, args.steps, args.batch, 0, 1)
    if rank == 0:
        diff = {f"{a}-{b}": float((results[a] - results[b]).abs().max())
                for a, b in (("sparse", "dense"), ("sparse", "single"), ("dense", "single"))}
        diff["moved"] = float((results["sparse"] - start).abs().max())
        diff["single-half"] = float((results["single"] - results["half"]).abs().max())
        diff["adam_sparse-adam_dense"] = float(
            (results["adam_sparse"] - results["adam_dense"]).abs().max())
        diff["adam-adagrad"] = float((results["adam_sparse"] - results["sparse"]).abs().max())
        # The modes: the same sums in another order (1e-5). Against one process the
        # batch mean is summed in another order too, and Adam and Adagrad divide by the
        # gradients' running size, so the tolerance of the image workload's test.
        ok = {k: bool(torch.allclose(results[a], results[b], rtol=rtol, atol=1e-5))
              for k, (a, b, rtol) in {"sparse-dense": ("sparse", "dense", 1e-5),
                                      "adam_sparse-adam_dense": ("adam_sparse", "adam_dense", 1e-5),
                                      "sparse-single": ("sparse", "single", 1e-4),
                                      "dense-single": ("dense", "single", 1e-4)}.items()}
        with open(args.out, "w") as fh:
            json.dump({"max_abs_diff": diff, "allclose": ok, "bytes": sent, "ranks": size}, fh)
        print(json.dumps({"max_abs_diff": diff, "bytes": sent}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
