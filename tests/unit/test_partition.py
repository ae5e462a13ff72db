"""Property tests of the epoch partition: the guarantees training correctness rests on."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from hpcdp.data.read import order as pt

WORLD_SIZES = (1, 2, 3, 4, 8)

seeds = st.integers(0, 2**32 - 1)
epochs = st.integers(0, 1000)
blocks = st.integers(1, 64)
windows = st.integers(1, 120)


@st.composite
def layouts(draw: st.DrawFn) -> dict[str, int]:
    """A random feasible layout: V | G, N >= G."""
    v = draw(st.sampled_from([1, 2, 3, 4, 6, 8, 12, 24]))
    u = draw(st.integers(1, 6))
    g = v * u
    n = draw(st.integers(g, g * 12 + 50))
    return {
        "num_samples": n,
        "block": draw(blocks),
        "seed": draw(seeds),
        "epoch": draw(epochs),
        "global_batch": g,
        "virtual_shards": v,
        "window": draw(windows),
    }


def _p(num_samples: int, block: int, seed: int, epoch: int) -> np.ndarray:
    """The block-permuted sample sequence P, built independently of positions_to_runs."""
    order = pt.epoch_block_order(num_samples, block, seed, epoch)
    return np.concatenate(
        [np.arange(b * block, min(num_samples, (b + 1) * block)) for b in order]
    )


@settings(max_examples=150, deadline=None)
@given(layouts())
def test_every_kept_sample_once_and_remainder_below_one_global_batch(lay: dict[str, int]) -> None:
    order = pt.global_order(**lay)
    flat = order.ravel()
    n, g = lay["num_samples"], lay["global_batch"]
    assert order.shape == (n // g, g)
    assert len(np.unique(flat)) == len(flat)
    assert flat.min() >= 0 and flat.max() < n
    assert 0 <= n - len(flat) < g
    # The kept samples are exactly the first steps*G entries of P.
    p = _p(n, lay["block"], lay["seed"], lay["epoch"])
    assert set(flat.tolist()) == set(p[: len(flat)].tolist())


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(48, 700),
    block=blocks,
    seed=seeds,
    epoch=epochs,
    window=windows,
)
def test_global_order_is_the_same_for_world_sizes_1_2_3_4_8(
    n: int, block: int, seed: int, epoch: int, window: int
) -> None:
    g = 48
    reference = pt.global_order(n, block, seed, epoch, g, 24, window)
    for w in WORLD_SIZES:
        v = pt.default_virtual_shards(g, w)
        assert v == 24
        per_rank = [
            pt.rank_order(n, block, seed, epoch, g, v, window, r, w) for r in range(w)
        ]
        # Equal steps on every rank, each rank's batch is its slice of the global batch.
        assert {part.shape for part in per_rank} == {(n // g, g // w)}
        np.testing.assert_array_equal(np.concatenate(per_rank, axis=1), reference)


@settings(max_examples=100, deadline=None)
@given(
    lay=layouts(),
    data=st.data(),
)
def test_resume_at_any_step_into_any_compatible_world(
    lay: dict[str, int], data: st.DataObject
) -> None:
    v, g = lay["virtual_shards"], lay["global_batch"]
    full = pt.global_order(**lay)
    steps = full.shape[0]
    j = data.draw(st.integers(0, steps), label="resume step")
    u = g // v
    stream_len = pt.stream_length(lay["num_samples"], g, v)
    position = j * u

    # Same global batch: the resumed run continues exactly.
    rest = pt.global_order(**lay, position=position, stream_len=stream_len)
    np.testing.assert_array_equal(np.concatenate([full[:j], rest]), full)

    # A different global batch (and any world size dividing V): no repeat, no skip.
    u2 = data.draw(st.integers(1, 5), label="new per-stream batch")
    g2 = v * u2
    other = {**lay, "global_batch": g2}
    rest2 = pt.global_order(**other, position=position, stream_len=stream_len)
    assert rest2.shape == (pt.steps_remaining(stream_len, position, u2), g2)
    seen = np.concatenate([full[:j].ravel(), rest2.ravel()])
    assert len(np.unique(seen)) == len(seen)
    # Per stream, consumption follows the stream order with nothing skipped.
    for s in range(v):
        stream = pt.stream_order(
            lay["num_samples"], lay["block"], lay["seed"], lay["epoch"], stream_len, s,
            lay["window"],
        )
        got = np.concatenate([full[:j, s * u : (s + 1) * u].ravel(),
                              rest2[:, s * u2 : (s + 1) * u2].ravel()])
        np.testing.assert_array_equal(got, stream[: len(got)])
        assert stream_len - len(got) < u2
    for w2 in [w for w in (1, 2, 3, 4, 6, 8, 12, 24) if v % w == 0 and g2 % w == 0]:
        parts = [
            pt.rank_order(**other, rank=r, world_size=w2, position=position, stream_len=stream_len)
            for r in range(w2)
        ]
        np.testing.assert_array_equal(np.concatenate(parts, axis=1), rest2)


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(1, 500), block=blocks, seed=seeds, epoch=epochs, data=st.data()
)
def test_runs_are_contiguous_file_ranges_of_p(
    n: int, block: int, seed: int, epoch: int, data: st.DataObject
) -> None:
    lo = data.draw(st.integers(0, n))
    hi = data.draw(st.integers(lo, n))
    order = pt.epoch_block_order(n, block, seed, epoch)
    runs = pt.positions_to_runs(n, block, order, lo, hi)
    np.testing.assert_array_equal(pt.runs_to_indices(runs), _p(n, block, seed, epoch)[lo:hi])
    assert all(0 <= s < e <= n for s, e in runs)
    # Merged: no run ends where the next one starts.
    assert all(a[1] != b[0] for a, b in zip(runs, runs[1:]))
    # Never more runs than blocks touched (reads stay block-sized or larger).
    assert len(runs) <= (hi - lo) // block + 3  # + partial ends and the short last block


@settings(max_examples=100, deadline=None)
@given(lay=layouts())
def test_shuffle_stays_inside_each_window(lay: dict[str, int]) -> None:
    n, k, g, v, w = (lay[x] for x in ("num_samples", "block", "global_batch", "virtual_shards",
                                      "window"))
    s_len = pt.stream_length(n, g, v)
    order = pt.epoch_block_order(n, k, lay["seed"], lay["epoch"])
    for s in range(v):
        shuffled = pt.stream_order(n, k, lay["seed"], lay["epoch"], s_len, s, w)
        plain = pt.runs_to_indices(pt.stream_runs(n, k, order, s_len, s, 0, s_len))
        for start in range(0, s_len, w):
            assert sorted(shuffled[start : start + w]) == sorted(plain[start : start + w])


def test_orders_differ_between_epochs_and_seeds() -> None:
    base = pt.global_order(4096, 16, 7, 0, 48, 24, 64)
    assert not np.array_equal(base, pt.global_order(4096, 16, 7, 1, 48, 24, 64))
    assert not np.array_equal(base, pt.global_order(4096, 16, 8, 0, 48, 24, 64))
    np.testing.assert_array_equal(base, pt.global_order(4096, 16, 7, 0, 48, 24, 64))


@pytest.mark.parametrize(
    ("g", "w", "v"),
    [(48, 1, 24), (48, 8, 24), (48, 16, 48), (32, 2, 8), (10, 5, 10), (7, 7, 7), (12, 3, 12)],
)
def test_default_virtual_shards(g: int, w: int, v: int) -> None:
    got = pt.default_virtual_shards(g, w)
    assert got == v
    assert g % got == 0 and got % w == 0


@given(g=st.integers(1, 500), w=st.integers(1, 64))
def test_default_virtual_shards_always_valid(g: int, w: int) -> None:
    assume(g % w == 0)
    v = pt.default_virtual_shards(g, w)
    assert pt.check_virtual_shards(v, g, w) == g // v


def test_errors_are_clear() -> None:
    with pytest.raises(pt.PartitionError, match="fewer samples than one global batch"):
        pt.steps_per_epoch(47, 48)
    with pytest.raises(pt.PartitionError, match="not a multiple of 5 virtual shards"):
        pt.check_virtual_shards(5, 48)
    with pytest.raises(pt.PartitionError, match="cannot be split evenly over 5 ranks"):
        pt.check_virtual_shards(24, 120, 5)
    with pytest.raises(pt.PartitionError, match="not a multiple of world size"):
        pt.default_virtual_shards(10, 4)
    with pytest.raises(pt.PartitionError, match="rank 2 is outside"):
        pt.rank_streams(4, 2, 2)


@given(seeds, epochs, st.integers(0, 23), st.integers(0, 50), st.integers(0, 300))
@settings(max_examples=60, deadline=None)
def test_window_permutation_is_a_permutation_fixed_by_its_key(
    seed: int, epoch: int, stream: int, k: int, length: int
) -> None:
    perm = pt.window_permutation(seed, epoch, stream, k, length)
    np.testing.assert_array_equal(np.sort(perm), np.arange(length))
    np.testing.assert_array_equal(perm, pt.window_permutation(seed, epoch, stream, k, length))


def test_permutations_differ_by_every_part_of_the_key() -> None:
    base = pt.window_permutation(7, 3, 2, 5, 200)
    for key in ((8, 3, 2, 5), (7, 4, 2, 5), (7, 3, 3, 5), (7, 3, 2, 6)):
        assert not np.array_equal(pt.window_permutation(*key, 200), base), key
    assert not np.array_equal(pt.epoch_block_order(4000, 10, 7, 3),
                              pt.epoch_block_order(4000, 10, 7, 4))


def test_permutations_are_the_same_in_every_thread() -> None:
    """The generator is kept per thread; a thread's draw must not depend on another's."""
    import threading

    want = [pt.window_permutation(1, 2, v, 3, 500) for v in range(8)]
    got: dict[int, list[np.ndarray]] = {}

    def draw(t: int) -> None:
        got[t] = [pt.window_permutation(1, 2, v, 3, 500) for v in range(8)]

    threads = [threading.Thread(target=draw, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    for t in range(4):
        for a, b in zip(got[t], want, strict=True):
            np.testing.assert_array_equal(a, b)
