"""PowerSGD's arithmetic (hpcdp.runtime.powersgd) without MPI: several ranks are several
codecs whose buffers the test sums, as the all-reduces would."""

from __future__ import annotations

import pytest
import torch

from hpcdp.models.vision import build_model
from hpcdp.runtime.powersgd import Codec, bytes_per_step, gains, layout, orthogonalise_

CPU = torch.device("cpu")


def codecs(shapes, ranks: int, rank: int = 2, min_elements: int = 1) -> list[Codec]:
    return [Codec(shapes, rank, min_elements, ranks, CPU, torch.float32, seed=3)
            for _ in range(ranks)]


def reduce(cs: list[Codec], grads: list[list[torch.Tensor]]) -> None:
    """One compressed step over simulated ranks: each buffer replaced by the sum of all."""
    p = torch.stack([c.compose(g) for c, g in zip(cs, grads)]).sum(0)
    for c in cs:
        c.p_flat.copy_(p)
    q = torch.stack([c.project() for c in cs]).sum(0)
    for c in cs:
        c.q_flat.copy_(q)
    for c, g in zip(cs, grads):
        assert c.expand(g)


def test_what_goes_whole() -> None:
    assert not gains((100,), 4, 1)  # a vector
    assert not gains((8, 8), 4, 1)  # 4 * (8 + 8) = 64 = 8 * 8: nothing gained
    assert gains((9, 9), 4, 1)
    assert not gains((64, 64), 4, 64 * 64 + 1)  # under the threshold
    assert gains((16, 3, 3, 3), 2, 1)  # a conv kernel: 16 x 27
    lay = layout([(16, 3, 3, 3), (16,), (10, 20)], 2, 1)
    assert lay.compressed == (0, 2) and lay.plain == (1,)
    # P factors first (16*2, then 10*2), then the vector; Q factors (27*2, 20*2)
    assert lay.p_slices == {0: (0, 32), 2: (32, 52), 1: (52, 68)}
    assert lay.q_slices == {0: (0, 54), 2: (54, 94)}
    assert bytes_per_step([(16, 3, 3, 3), (16,), (10, 20)], 2, 1) == ((68 + 94) * 4,
                                                                       (432 + 16 + 200) * 4)


def test_resnet18_at_rank_4_sends_under_a_twentieth() -> None:
    net = build_model("resnet18", (3, 224, 224), 1000)
    shapes = [tuple(p.shape) for p in net.parameters()]
    sent, whole = bytes_per_step(shapes, 4, 4096)
    assert whole == sum(p.numel() for p in net.parameters()) * 4
    assert sent * 20 <= whole, (sent, whole)
    # The runtime reports the bytes of the buffers it hands over: the same figure.
    codec = Codec(shapes, 4, 4096, 2, CPU, torch.float32)
    assert codec.handed_bytes == sent
    assert codec.p_flat.numel() + codec.q_flat.numel() == sent // 4


def test_orthogonalise_gives_orthonormal_rows_the_same_bits_each_time() -> None:
    pt = torch.randn(4, 50, generator=torch.Generator().manual_seed(0))  # P^T: rows
    a, b = pt.clone(), pt.clone()
    orthogonalise_(a)
    orthogonalise_(b)
    assert torch.equal(a, b)
    torch.testing.assert_close(a @ a.T, torch.eye(4), atol=1e-5, rtol=0)
    zero = torch.zeros(2, 5)
    orthogonalise_(zero)
    assert torch.equal(zero, torch.zeros(2, 5))  # a zero gradient stays zero, not NaN


def test_ranks_get_the_same_bits_and_the_residuals_keep_what_was_not_sent() -> None:
    shapes = [(12, 10), (7,), (6, 2, 3)]
    gen = torch.Generator().manual_seed(1)
    cs = codecs(shapes, 3)
    for _ in range(3):
        grads = [[torch.randn(s, generator=gen) for s in shapes] for _ in cs]
        before = [[g.clone() for g in gs] for gs in grads]
        m = [[g + c.residuals.get(i, 0) for i, g in enumerate(gs)] for c, gs in zip(cs, grads)]
        reduce(cs, grads)
        for gs in grads[1:]:
            for a, b in zip(grads[0], gs):
                assert torch.equal(a, b)  # every rank holds the same averaged gradients
        mean_vector = sum(gs[1] for gs in before) / 3
        torch.testing.assert_close(grads[0][1], mean_vector)  # sent whole: the plain mean
        for c, mine in zip(cs, m):  # M = approximation + residual, per rank
            for i in (0, 2):
                torch.testing.assert_close(grads[0][i] + c.residuals[i], mine[i])


def test_a_low_rank_mean_is_sent_exactly() -> None:
    u, v = torch.randn(12, 1), torch.randn(1, 10)
    cs = codecs([(12, 10)], 2)
    grads = [[u @ v * 3.0], [u @ v * 1.0]]  # mean 2 u v: rank 1 < 2
    reduce(cs, grads)
    torch.testing.assert_close(grads[0][0], 2.0 * u @ v, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(cs[0].residuals[0] + cs[1].residuals[0], torch.zeros(12, 10),
                               atol=1e-5, rtol=0)


def quadratic_loss(compression: str, steps: int = 300, lr: float = 0.03) -> float:
    """Gradient descent on 0.5 sum(c_j (W - T)_ij^2), columns of curvature 1 down to 0.1:
    gradients uncompressed ("none"), or sent at rank 1 with the residual kept
    ("feedback") or dropped after every step ("dropped")."""
    gen = torch.Generator().manual_seed(0)
    target = torch.randn(40, 30, generator=gen)
    curvature = torch.logspace(0, -1, 30)
    w = torch.zeros(40, 30)
    codec = codecs([(40, 30)], 1, rank=1)[0]
    for _ in range(steps):
        grads = [(w - target) * curvature]
        if compression != "none":
            reduce([codec], [grads])
        if compression == "dropped":
            codec.residuals[0].zero_()
        w -= lr * grads[0]
    return float(0.5 * ((w - target) ** 2 * curvature).sum())


def test_error_feedback_matters_on_a_quadratic() -> None:
    plain, kept, dropped = (quadratic_loss(c) for c in ("none", "feedback", "dropped"))
    assert kept < 1.1 * plain  # with the residual: as far as uncompressed descent
    assert dropped > 20 * kept  # without it, the directions not sent are never made up


def test_non_finite_factors_reset_every_rank_alike() -> None:
    cs = codecs([(12, 10)], 2)
    q0 = cs[0].q_flat.clone()
    good = [[torch.randn(12, 10)], [torch.randn(12, 10)]]
    reduce(cs, good)
    assert not torch.equal(cs[0].q_flat, q0)
    bad = [[torch.full((12, 10), float("nan"))], [torch.randn(12, 10)]]
    p = cs[0].compose(bad[0]) + cs[1].compose(bad[1])
    for c in cs:
        c.p_flat.copy_(p)
    q = cs[0].project() + cs[1].project()
    for c, g in zip(cs, bad):
        c.q_flat.copy_(q)
        assert not c.expand(g)
        assert torch.equal(c.q_flat, q0) and not c.residuals[0].any()
    assert not torch.isfinite(bad[1][0]).all()  # the step's NaN policy still sees it


def test_state_round_trip_and_a_state_for_other_gradients() -> None:
    a = codecs([(12, 10), (3,)], 1)[0]
    reduce([a], [[torch.randn(12, 10), torch.randn(3)]])
    a.steps = 7
    state = a.state_dict()
    b = codecs([(12, 10), (3,)], 1)[0]
    assert b.load_state_dict(state, residuals=True) is None
    assert b.steps == 7 and torch.equal(b.q_flat, a.q_flat)
    assert torch.equal(b.residuals[0], a.residuals[0])
    c = codecs([(12, 10), (3,)], 1)[0]
    assert c.load_state_dict(state, residuals=False) is None  # another world size
    assert torch.equal(c.q_flat, a.q_flat) and not c.residuals[0].any()
    other = codecs([(12, 10), (3,)], 1, rank=3)[0]
    note = other.load_state_dict(state, residuals=True)
    assert note and "start afresh" in note and other.steps == 7


def test_rank_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="rank must be at least 1"):
        layout([(4, 4)], 0, 1)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_on_a_gpu_as_on_the_cpu() -> None:
    shapes = [(64, 3, 3, 3), (64,), (10, 64)]
    gen = torch.Generator().manual_seed(2)
    grads = [[torch.randn(s, generator=gen) for s in shapes] for _ in range(2)]
    on_gpu = [[g.cuda() for g in gs] for gs in grads]
    cpu = codecs(shapes, 2)
    gpu = [Codec(shapes, 2, 1, 2, torch.device("cuda"), torch.float32, seed=3) for _ in range(2)]
    reduce(cpu, grads)
    reduce(gpu, on_gpu)
    assert torch.equal(on_gpu[0][0], on_gpu[1][0])
    for a, b in zip(grads[0], on_gpu[0]):
        torch.testing.assert_close(b.cpu(), a, atol=1e-4, rtol=1e-4)
