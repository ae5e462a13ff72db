"""Two ways to average embedding gradients over ranks, and what each sends per step.

- ``sparse``: Horovod's sparse path. A table's gradient stays sparse (the rows
  this rank's batch looked up, with their indices); Horovod all-gathers indices
  and values from every rank and divides by the world size. Before Horovod sees
  it, each table gradient is coalesced (rows looked up several times summed into
  one), so a rank sends one row per distinct id rather than one per lookup.
- ``dense``: Horovod's ``sparse_as_dense``. The gradient is made dense (the
  whole table, zeros where nothing was looked up) and all-reduced with the
  other gradients.

The sparse path sends in proportion to the distinct ids per batch and the
world size; the dense path in proportion to the table sizes. hpcdp's flat
gradient buckets (`hpcdp.runtime.grad_buckets`) take dense gradients only, so the
tables always go through Horovod's `DistributedOptimizer`; the MLPs may use
either.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

#: Named parameters: (name, parameter) pairs, as `model.named_parameters()` yields them.
Named = Sequence[tuple[str, nn.Parameter]]

GRAD_MODES = ("sparse", "dense")
INDEX_BYTES = 8  # Horovod gathers a sparse gradient's indices as int64


def coalesce_table_grads(tables: Named) -> list[Any]:
    """Sum duplicate rows of every sparse table gradient as backward produces it
    (`tables`: the model's embedding tables, hpcdp.models.dlrm.split_params).

    A tensor hook on the weight runs before the gradient reaches `.grad`, so
    Horovod's hook (which fires after) sees the coalesced gradient. Returns the
    hook handles.
    """
    return [p.register_hook(lambda g: g.coalesce() if g.is_sparse else g) for _, p in tables]


def distribute(tables: Named, rest: Named, sparse_opt: torch.optim.Optimizer,
               dense_opt: torch.optim.Optimizer, mode: str) -> tuple[Any, Any]:
    """Both optimizers wrapped in Horovod's `DistributedOptimizer`, the tables by `mode`.

    Call `coalesce_table_grads(tables)` once first for the sparse mode's byte count.
    In the dense mode Horovod turns the averaged gradient back into a sparse one
    before the step, so either table optimizer (Adagrad, SparseAdam) works in both.
    """
    import horovod.torch as hvd

    if mode not in GRAD_MODES:
        raise ValueError(f"gradient mode {mode!r}: choose one of {', '.join(GRAD_MODES)}")
    sparse = hvd.DistributedOptimizer(sparse_opt, named_parameters=tables,
                                      sparse_as_dense=mode == "dense", op=hvd.Average)
    dense = hvd.DistributedOptimizer(dense_opt, named_parameters=rest, op=hvd.Average)
    return sparse, dense


def unique_rows(sparse: torch.Tensor) -> list[int]:
    """Distinct ids of each field (column) in one batch of ids (B, fields)."""
    return [int(torch.unique(sparse[:, j]).numel()) for j in range(sparse.shape[1])]


def table_payload(mode: str, unique: Sequence[int], table_sizes: Sequence[int],
                  embed_dim: int, value_bytes: int = 4) -> int:
    """Bytes of one rank's table gradients handed to Horovod in one step.

    sparse: each distinct row's values and its index; dense: every table whole.
    """
    if mode == "sparse":
        return sum(u * (embed_dim * value_bytes + INDEX_BYTES) for u in unique)
    if mode == "dense":
        return sum(table_sizes) * embed_dim * value_bytes
    raise ValueError(f"gradient mode {mode!r}: choose one of {', '.join(GRAD_MODES)}")


def bytes_sent_per_rank(mode: str, payloads: Sequence[int], mlp_bytes: int) -> float:
    """Average bytes one rank sends in one step, with ring collectives over W ranks.

    `payloads`: each rank's `table_payload` this step; `mlp_bytes`: the dense
    gradients' bytes. A ring all-reduce of S bytes sends 2 (W-1)/W S per rank; a
    ring all-gather sends every block but one, (W-1)/W of the gathered total on
    average. Horovod's MPI and Gloo back-ends may choose other algorithms; this is
    the standard cost model, used to compare the two modes.
    """
    world = len(payloads)
    if world < 1:
        raise ValueError("need the payload of at least one rank")
    share = (world - 1) / world
    mlp = 2 * share * mlp_bytes
    if mode == "sparse":
        return share * sum(payloads) + mlp
    if mode == "dense":
        return 2 * share * payloads[0] + mlp
    raise ValueError(f"gradient mode {mode!r}: choose one of {', '.join(GRAD_MODES)}")
