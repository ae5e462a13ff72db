"""The Markov corpus: its entropy rate against hand-computed chains, and its documents."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hpcdp.data.prep.text import markov as mk


def uniform_chain(symbols: int, end_prob: float) -> mk.MarkovChain:
    """Every symbol is followed by any symbol with equal probability."""
    nxt = np.tile(np.arange(symbols), (symbols, 1))
    return mk.MarkovChain(symbols, nxt, np.full((symbols, symbols), 1 / symbols), end_prob)


def test_two_symbols_uniform_by_hand() -> None:
    # Symbols {0, 1}, end probability 1/2. From a symbol: EOD 1/2, each symbol 1/4
    # (entropy 1.5 ln 2); from EOD: each symbol 1/2 (ln 2). A document has on average
    # 2 symbols and 1 EOD, so EOD is 1/3 of the stream: H = 2/3 * 1.5 ln2 + 1/3 ln2.
    chain = uniform_chain(2, 0.5)
    assert mk.entropy_rate(chain) == pytest.approx(4 / 3 * math.log(2), abs=1e-12)
    mu = mk.stationary(mk.transition_matrix(chain))
    np.testing.assert_allclose(mu, [1 / 3, 1 / 3, 1 / 3], atol=1e-12)


def test_deterministic_successor_by_hand() -> None:
    # One successor per symbol: the only uncertainty is where documents end and
    # which symbol starts the next. Symbols 0 -> 1 -> 0 ..., end probability q:
    # mean document 1/q symbols + EOD; H = (H_b(q) + q ln 2) / (1 + q).
    q = 0.2
    chain = mk.MarkovChain(2, np.array([[1], [0]]), np.ones((2, 1)), q)
    hb = -q * math.log(q) - (1 - q) * math.log(1 - q)
    assert mk.entropy_rate(chain) == pytest.approx((hb + q * math.log(2)) / (1 + q), abs=1e-12)


def test_random_chain_rows_and_floor_against_a_sampled_stream() -> None:
    chain = mk.random_chain(16, 3, 0.1, seed=7)
    p = mk.transition_matrix(chain)
    np.testing.assert_allclose(p.sum(axis=1), 1.0)
    assert ((p[:16, :16] > 0).sum(axis=1) == 3).all()
    docs = mk.sample_documents(chain, seed=1, split=0, lo=0, hi=20_000)
    stream = np.concatenate(docs)
    assert all(d[-1] == chain.eod and (d[:-1] < chain.eod).all() and len(d) >= 2 for d in docs)
    # The true chain's loss on a long sample is the entropy rate, up to sampling noise.
    assert mk.stream_nll(chain, stream) == pytest.approx(mk.entropy_rate(chain), abs=0.02)
    assert np.mean([len(d) - 1 for d in docs]) == pytest.approx(1 / 0.1, rel=0.05)


def test_documents_do_not_depend_on_how_they_are_split() -> None:
    chain = mk.random_chain(8, 2, 0.2, seed=0)
    whole = mk.sample_documents(chain, 3, 0, 0, 3000)
    cuts = [0, 1024, 1500, 3000]
    parts = [d for a, b in zip(cuts, cuts[1:]) for d in mk.sample_documents(chain, 3, 0, a, b)]
    assert len(whole) == len(parts) == 3000
    assert all(np.array_equal(a, b) for a, b in zip(whole, parts))
    other_split = mk.sample_documents(chain, 3, 1, 0, 10)
    assert not all(np.array_equal(a, b) for a, b in zip(whole[:10], other_split))


def test_default_chain_is_seeded() -> None:
    a, b = mk.random_chain(seed=1), mk.random_chain(seed=1)
    np.testing.assert_array_equal(a.next_symbols, b.next_symbols)
    assert mk.entropy_rate(a) == mk.entropy_rate(b)
    assert 0 < mk.entropy_rate(a) < math.log(4) + 0.3
    with pytest.raises(ValueError, match="successors"):
        mk.random_chain(4, 5)


def test_conditional_entropy_of_streams_with_known_answers() -> None:
    assert mk.conditional_entropy(np.tile([0, 1, 2], 100), 3) == 0.0  # each fixes the next
    rng = np.random.default_rng(0)
    coin = rng.integers(0, 2, 200_000)
    assert mk.conditional_entropy(coin, 2) == pytest.approx(np.log(2), abs=1e-3)
    chain = mk.random_chain(8, 2, 0.1, seed=1)
    stream = np.concatenate(mk.sample_documents(chain, 0, 0, 0, 3000))
    assert mk.conditional_entropy(stream, chain.vocab_size) == pytest.approx(
        mk.entropy_rate(chain), abs=0.01)


def test_the_corrected_estimate_removes_the_plug_in_bias() -> None:
    rng = np.random.default_rng(1)
    coin = rng.integers(0, 8, 400)  # uniform over 8: few samples per pair, plug-in low
    plain = mk.conditional_entropy(coin, 8)
    fixed = mk.conditional_entropy(coin, 8, corrected=True)
    assert plain < np.log(8) - 0.05
    assert abs(fixed - np.log(8)) < abs(plain - np.log(8)) / 3
