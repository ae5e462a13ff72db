"""A DLRM-style click model (Naumov et al. 2019): embeddings, two MLPs, dot interactions.

One `nn.Embedding` per categorical field with sparse gradients (backward touches
only the rows a batch looked up); a bottom MLP maps the dense features to the
embedding dimension; the pairwise dot products of the bottom output and the 26
embeddings (the strictly lower triangle of their Gram matrix), beside the
bottom output, feed a top MLP that ends in one logit per row. The loss is binary
cross-entropy on that logit.

Embedding parameters and the rest are kept apart (`split_params`): the tables
take a sparse optimizer (Adagrad or SparseAdam), the MLPs a dense one.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn


def mlp(sizes: Sequence[int], last_relu: bool) -> nn.Sequential:
    """Linear layers of widths `sizes` (input first), ReLU between (and after the last)."""
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(nn.Linear(a, b))
        if last_relu or i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DLRM(nn.Module):
    """Click logits from dense features (B, dense) and categorical ids (B, fields).

    `bottom` and `top` are the hidden widths of the two MLPs; the bottom MLP ends
    at `embed_dim` (so its output joins the interactions) and the top MLP at 1.
    """

    def __init__(self, dense_features: int, table_sizes: Sequence[int], embed_dim: int = 16,
                 bottom: Sequence[int] = (64,), top: Sequence[int] = (64,)) -> None:
        super().__init__()
        if not table_sizes or min(table_sizes) < 1:
            raise ValueError(f"every table needs at least one row, got {list(table_sizes)}")
        self.table_sizes = tuple(int(s) for s in table_sizes)
        self.embed_dim = embed_dim
        self.embeddings = nn.ModuleList(
            nn.Embedding(size, embed_dim, sparse=True) for size in self.table_sizes)
        for table in self.embeddings:  # small uniform init, as DLRM's reference does
            bound = 1.0 / table.num_embeddings ** 0.5
            nn.init.uniform_(table.weight, -bound, bound)
        self.bottom = mlp([dense_features, *bottom, embed_dim], last_relu=True)
        vectors = len(self.table_sizes) + 1
        pairs = vectors * (vectors - 1) // 2
        self.top = mlp([embed_dim + pairs, *top, 1], last_relu=False)
        rows, cols = torch.tril_indices(vectors, vectors, offset=-1)
        self.register_buffer("_rows", rows, persistent=False)
        self.register_buffer("_cols", cols, persistent=False)

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        """Logits of shape (B,)."""
        x = self.bottom(dense.float())
        ids = sparse.long()
        vectors = [x] + [table(ids[:, j]) for j, table in enumerate(self.embeddings)]
        t = torch.stack(vectors, dim=1)  # (B, fields + 1, D)
        gram = torch.bmm(t, t.transpose(1, 2))
        pairs = gram[:, self._rows, self._cols]
        return self.top(torch.cat([x, pairs], dim=1)).squeeze(1)


class ClickModel(DLRM):
    """DLRM taking its inputs as one value, (dense, sparse), as the trainer passes it."""

    def forward(self, inputs: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:  # type: ignore[override]
        dense, sparse = inputs
        return super().forward(dense, sparse)


def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean binary cross-entropy of click logits against 0/1 labels (any dtype)."""
    return F.binary_cross_entropy_with_logits(logits, labels.to(logits.dtype))


def split_params(model: nn.Module) -> tuple[list[tuple[str, nn.Parameter]],
                                            list[tuple[str, nn.Parameter]]]:
    """(embedding tables, everything else) as named parameters, in module order.

    A table is the weight of an `nn.Embedding` built with `sparse=True`: its
    gradients are sparse and need a sparse-capable optimizer.
    """
    sparse_ids = {id(m.weight) for m in model.modules()
                  if isinstance(m, nn.Embedding) and m.sparse}
    tables, rest = [], []
    for name, p in model.named_parameters():
        (tables if id(p) in sparse_ids else rest).append((name, p))
    return tables, rest


SPARSE_OPTIMIZERS = ("adagrad", "sparse_adam")


def make_optimizers(model: nn.Module, sparse: str = "adagrad", sparse_lr: float = 0.05,
                    dense_lr: float = 1e-3, initial_accumulator: float = 0.0,
                    ) -> tuple[torch.optim.Optimizer, torch.optim.Optimizer]:
    """(optimizer of the tables, Adam of the MLPs).

    `initial_accumulator` (Adagrad only) damps the first steps of a row: without it,
    Adagrad's first step on a rarely seen row is about the learning rate whatever
    the gradient, which lets rare ids memorize their few labels (docs/recsys.md).
    """
    tables, rest = split_params(model)
    table_params = [p for _, p in tables]
    if sparse == "adagrad":
        sparse_opt: torch.optim.Optimizer = torch.optim.Adagrad(
            table_params, lr=sparse_lr, initial_accumulator_value=initial_accumulator)
    elif sparse == "sparse_adam":
        sparse_opt = torch.optim.SparseAdam(table_params, lr=sparse_lr)
    else:
        raise ValueError(f"sparse optimizer {sparse!r}: choose one of {SPARSE_OPTIMIZERS}")
    return sparse_opt, torch.optim.Adam([p for _, p in rest], lr=dense_lr)
