"""hpcdp.plan.model against cases worked out by hand."""

from __future__ import annotations

import math

import pytest

from hpcdp.plan import model
from hpcdp.plan.model import Link, Network, Step

US, GBPS = 1e-6, 1e-9  # alpha in microseconds; beta = 1/(GB/s) in s per byte


def test_ring_two_ranks() -> None:
    # p=2: 2*1*alpha + 2*1/2*n*beta = 2*10us + 1e6 B * 1e-9 s/B = 20us + 1 ms.
    link = Link(10 * US, GBPS)
    assert model.ring_allreduce_s(1e6, 2, link) == pytest.approx(20e-6 + 1e-3)


def test_ring_four_ranks_with_reduction() -> None:
    # p=4: 6 alpha + 2*3/4 n beta + 3/4 n gamma = 6us + 1.5 ms + 0.75 * 1e6 * 1e-10 s.
    link = Link(1 * US, GBPS, 1e-10)
    assert model.ring_allreduce_s(1e6, 4, link) == pytest.approx(6e-6 + 1.5e-3 + 0.75e-4)


def test_one_rank_costs_nothing() -> None:
    assert model.ring_allreduce_s(1e9, 1, Link(1.0, 1.0)) == 0.0


def test_hierarchical_four_nodes_of_two() -> None:
    # n = 8 MB, g = 2, N = 4. Within: alpha 1us, 10 GB/s; across: alpha 5us, 1 GB/s.
    # scatter: 1us + 1/2*8e6*1e-10 = 1us + 0.4 ms; gather the same.
    # across: two rings of 4e6 B over 4 nodes sharing the node's 1 GB/s:
    # 6*5us + 2*3/4*4e6*2*1e-9 = 30us + 12 ms (the node sends 2*3/4*8e6 B in all).
    net = Network(Link(1 * US, 1e-10), Link(5 * US, GBPS))
    got = model.allreduce_s(8e6, 4, 2, net)
    assert got == pytest.approx(2 * (1e-6 + 0.4e-3) + 30e-6 + 12e-3)


def test_flat_ring_across_nodes_waits_on_the_slow_link() -> None:
    # p = 8 ranks, every step on the inter link: 14*5us + 2*7/8*8e6*1e-9 = 70us + 14 ms.
    net = Network(Link(1 * US, 1e-10), Link(5 * US, GBPS), hierarchical=False)
    assert model.allreduce_s(8e6, 4, 2, net) == pytest.approx(70e-6 + 14e-3)


def test_hierarchical_saves_latency_steps_across_nodes() -> None:
    # 4 nodes of 8: the flat ring makes 2*31 steps on the slow link, the hierarchy 2*3 there
    # (and 2*7 fast ones); in bandwidth it sends 2*3/4 n per node instead of 2*31/32 n.
    fast, slow = Link(1 * US, 1e-11), Link(5 * US, GBPS)
    small_h = model.allreduce_s(1e3, 4, 8, Network(fast, slow))
    small_f = model.allreduce_s(1e3, 4, 8, Network(fast, slow, hierarchical=False))
    assert small_h < small_f / 4
    big_h = model.allreduce_s(1e9, 4, 8, Network(fast, slow))
    big_f = model.allreduce_s(1e9, 4, 8, Network(fast, slow, hierarchical=False))
    assert big_h == pytest.approx(1.5 + 2 * 7 * 1e-6 + 2 * 7 / 8 * 1e9 * 1e-11 + 30e-6)
    assert big_f == pytest.approx(2 * 31 / 32 + 62 * 5e-6)


def test_exposed_comm_by_hand() -> None:
    # Ready at 1, 2, 3; each takes 1.5. Ends: 2.5, 4.0, 5.5; backward ends at 3 -> 2.5.
    assert model.exposed_comm_s([1, 2, 3], [1.5, 1.5, 1.5], 3.0) == pytest.approx(2.5)
    # Short all-reduces all hidden but the last's: ends 1.1, 2.1, 3.1 -> 0.1.
    assert model.exposed_comm_s([1, 2, 3], [0.1, 0.1, 0.1], 3.0) == pytest.approx(0.1)


def test_ready_times_in_proportion_to_bytes() -> None:
    assert model.ready_times_s([1, 1, 2], 8.0) == [2.0, 4.0, 8.0]


def test_fused() -> None:
    assert model.fused([3, 3, 3, 3, 1], 5) == (6, 6, 1)
    assert model.fused([10], 4) == (10,)
    with pytest.raises(ValueError):
        model.fused([1], 0)


def test_step_and_efficiency_by_hand() -> None:
    # Measured at batch 32: compute 90 ms (60 backward), data 10 ms, one 4 MB bucket.
    # Global batch 64, 1 rank per node, inter link 10us, 1 GB/s.
    # 1 node: 64/32 = 2x -> data 20, compute 180, no comm: step 200 ms, 320 samples/s.
    # 2 nodes: 1x -> data 10, compute 90; all-reduce 2*10us + 4e6*1e-9 = 4.02 ms,
    # ready at the end of backward (one bucket): all exposed -> 104.02 ms.
    step = Step(compute_s=0.09, data_s=0.01, measured_batch=32, bucket_bytes=(4_000_000,),
                backward_share=2 / 3)
    net = Network(Link(0, 0), Link(10 * US, GBPS))
    one, two = model.predict(step, net, 2, 1, 64)
    assert one.step_s == pytest.approx(0.2) and one.samples_per_s == pytest.approx(320)
    assert one.efficiency == pytest.approx(1.0)
    assert two.step_s == pytest.approx(0.10402)
    assert two.exposed_s == pytest.approx(two.comm_s)
    assert two.efficiency == pytest.approx((64 / 0.10402) / (2 * 320))


def test_overlap_hides_early_buckets() -> None:
    # Two 2 MB buckets; backward 60 ms -> ready at 30 and 60 ms; each takes 2.02 ms.
    # First ends 32.02, second starts at 60 and ends 62.02: 2.02 ms exposed.
    step = Step(0.09, 0.0, 32, (2_000_000, 2_000_000))
    net = Network(Link(0, 0), Link(10 * US, GBPS))
    _, two = model.predict(step, net, 2, 1, 64)
    assert two.exposed_s == pytest.approx(2.02e-3)
    no = model.predict(Step(0.09, 0.0, 32, (2_000_000, 2_000_000), overlap=False), net, 2, 1,
                       64)[1]
    assert no.exposed_s == pytest.approx(4.04e-3)


def test_nodes_for_target_and_range() -> None:
    step = Step(0.09, 0.01, 32, (4_000_000,))
    net = Network(Link(1 * US, 1e-10), Link(10 * US, GBPS))
    preds = model.predict(step, net, 8, 1, 256)
    effs = [p.efficiency for p in preds]
    assert effs == sorted(effs, reverse=True)  # falls with every node here
    top = model.nodes_for(preds, 0.8)
    assert top is not None and preds[top - 1].efficiency >= 0.8
    assert top == 8 or preds[top].efficiency < 0.8 or not preds[top].fits_batch
    low, high = model.suggested_range(preds, 0.8)
    assert high == top and preds[low - 1].samples_per_s >= preds[high - 1].samples_per_s / 2
    assert model.nodes_for(preds, 1.01) is None and model.suggested_range(preds, 1.01) is None


def test_batch_that_does_not_divide_is_marked() -> None:
    preds = model.predict(Step(0.1, 0, 32, (1000,)), Network(Link(0, 0), Link(0, 0)), 3, 1, 64)
    assert [p.fits_batch for p in preds] == [True, True, False]


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf])
def test_link_refuses_bad_values(bad: float) -> None:
    with pytest.raises(ValueError, match="alpha_s"):
        Link(bad, 0.0)


def test_step_refuses_bad_values() -> None:
    with pytest.raises(ValueError, match="backward share"):
        Step(0.1, 0, 32, (1,), backward_share=1.5)
    with pytest.raises(ValueError, match="bucket sizes"):
        Step(0.1, 0, 32, (0,))


def test_fixed_part_does_not_shrink_with_the_batch() -> None:
    # 30 ms at batch 32, 20 ms at 16: fixed 10 ms, 20 ms for 32 samples.
    assert model.fixed_part_s(0.030, 0.020) == pytest.approx(0.010)
    assert model.fixed_part_s(0.030, 0.014) == 0.0 and model.fixed_part_s(0.03, 0.04) == 0.03
    # On 2 ranks (16 samples each of a global 32): 10 + 20/2 = 20 ms compute, not 15.
    step = Step(0.030, 0.0, 32, (1000,), fixed_s=0.010)
    net = Network(Link(0, 0), Link(0, 0))
    assert model.step_at(step, net, 2, 1, 32)[2] == pytest.approx(0.020)
    with pytest.raises(ValueError, match="fixed time"):
        Step(0.030, 0.0, 32, (1000,), fixed_s=0.05)
