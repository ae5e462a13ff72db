"""The DLRM-style click model: shapes, sparse table gradients, the parameter split."""

from __future__ import annotations

import pytest
import torch

from hpcdp.models.dlrm import DLRM, loss_fn, make_optimizers, split_params

SIZES = [7, 5, 30]


def batch(n: int = 6, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    dense = torch.randn(n, 13, generator=g)
    ids = torch.stack([torch.randint(0, s, (n,), generator=g) for s in SIZES], 1).int()
    return dense, ids, torch.randint(0, 2, (n,), generator=g).to(torch.uint8)


def test_logits_and_interactions() -> None:
    model = DLRM(13, SIZES, embed_dim=4, bottom=(8,), top=(8,))
    dense, ids, _ = batch()
    assert model(dense, ids).shape == (6,)
    # 3 tables + the bottom output = 4 vectors: 6 pairwise dots, beside the 4-wide bottom.
    assert model.top[0].in_features == 4 + 6
    assert [t.num_embeddings for t in model.embeddings] == SIZES


def test_interactions_are_the_pairwise_dots() -> None:
    model = DLRM(13, SIZES, embed_dim=4)
    dense, ids, _ = batch(1)
    x = model.bottom(dense)
    vecs = [x[0]] + [t(ids[0, j].long()) for j, t in enumerate(model.embeddings)]
    want = [torch.dot(vecs[i], vecs[j]) for i in range(4) for j in range(i)]
    got = model.top(torch.cat([x, torch.stack(want)[None]], 1)).squeeze(1)
    torch.testing.assert_close(model(dense, ids), got)


def test_tables_get_sparse_gradients_of_the_looked_up_rows_only() -> None:
    model = DLRM(13, SIZES, embed_dim=4)
    dense, ids, label = batch()
    loss_fn(model(dense, ids), label).backward()
    tables, rest = split_params(model)
    assert [n for n, _ in tables] == [f"embeddings.{j}.weight" for j in range(3)]
    assert rest and all(not n.startswith("embeddings") for n, _ in rest)
    for j, (_, p) in enumerate(tables):
        assert p.grad.is_sparse
        rows = set(p.grad.coalesce().indices()[0].tolist())
        assert rows == set(ids[:, j].tolist())
    assert all(not p.grad.is_sparse for _, p in rest)


@pytest.mark.parametrize("kind", ["adagrad", "sparse_adam"])
def test_a_step_moves_only_the_looked_up_rows(kind: str) -> None:
    model = DLRM(13, SIZES, embed_dim=4)
    sparse_opt, dense_opt = make_optimizers(model, kind)
    before = model.embeddings[2].weight.detach().clone()
    dense, ids, label = batch()
    loss_fn(model(dense, ids), label).backward()
    sparse_opt.step()
    dense_opt.step()
    moved = (model.embeddings[2].weight.detach() != before).any(1).nonzero().reshape(-1)
    assert set(moved.tolist()) == set(ids[:, 2].tolist())


def test_loss_is_bce_on_logits_and_bad_options_are_named() -> None:
    logits, labels = torch.tensor([0.0, 2.0]), torch.tensor([1, 0], dtype=torch.uint8)
    want = -(torch.log(torch.sigmoid(torch.tensor(0.0))) + torch.log(1 - torch.sigmoid(
        torch.tensor(2.0)))) / 2
    torch.testing.assert_close(loss_fn(logits, labels), want)
    with pytest.raises(ValueError, match="sparse optimizer 'sgd'"):
        make_optimizers(DLRM(13, SIZES), "sgd")
    with pytest.raises(ValueError, match="at least one row"):
        DLRM(13, [3, 0])


def test_coalesced_table_gradients_hold_one_row_per_distinct_id() -> None:
    from hpcdp.runtime.sparse_grads import coalesce_table_grads, unique_rows

    model = DLRM(13, SIZES, embed_dim=4)
    coalesce_table_grads(split_params(model)[0])
    dense, ids, label = batch(40)
    loss_fn(model(dense, ids), label).backward()
    for j, (_, p) in enumerate(split_params(model)[0]):
        # What Horovod's sparse path sends: the gradient's stored rows (indices and values).
        # (AccumulateGrad copies the gradient and drops the coalesced flag, not the summing.)
        assert p.grad._nnz() == unique_rows(ids)[j] < 40


def test_a_damped_adagrad_takes_a_smaller_first_step() -> None:
    steps = []
    for acc in (0.0, 1.0):
        model = DLRM(13, SIZES, embed_dim=4)
        sparse_opt, _ = make_optimizers(model, "adagrad", initial_accumulator=acc)
        before = model.embeddings[0].weight.detach().clone()
        dense, ids, label = batch()
        loss_fn(model(dense, ids), label).backward()
        sparse_opt.step()
        steps.append(float((model.embeddings[0].weight.detach() - before).abs().max()))
    assert steps[0] == pytest.approx(0.05, rel=1e-3)  # lr x sign(g): the gradient's size is lost
    assert steps[1] < steps[0] / 10
