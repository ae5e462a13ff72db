"""A corpus with a known answer: documents drawn from a seeded sparse Markov chain.

Each document starts with a symbol drawn uniformly from ``symbols``; after each
symbol the document ends with probability ``end_prob`` (the end-of-document token
``EOD = symbols`` is written), else the next symbol is one of the current one's
``successors`` fixed successors, with fixed random probabilities.

Written one document after another, the token stream is itself a Markov chain
over ``symbols + 1`` states (EOD goes to a uniform first symbol). A language
model is scored on every next token of that stream, the end tokens and the first
token after them included, so the floor of its loss is the stream's entropy rate
``H = sum_i mu_i * H(P[i, :])`` (``mu`` the stationary distribution), in nats per
token: `entropy_rate`. No model can do better on average; a model that learns the
chain comes close. The uniform restart makes the chain irreducible and aperiodic
(cycles EOD->a->EOD and EOD->a->b->EOD), so ``mu`` is unique.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class MarkovChain:
    """``next_symbols[s]`` are symbol s's successors, ``next_probs[s]`` their probabilities."""

    symbols: int
    next_symbols: np.ndarray  # (symbols, successors) int
    next_probs: np.ndarray  # (symbols, successors) float, rows sum to 1
    end_prob: float

    @property
    def eod(self) -> int:
        return self.symbols

    @property
    def vocab_size(self) -> int:
        return self.symbols + 1


def random_chain(symbols: int = 64, successors: int = 4, end_prob: float = 1 / 32,
                 seed: int = 0) -> MarkovChain:
    """Distinct random successors per symbol, their probabilities from a flat Dirichlet."""
    if symbols < 1 or not 1 <= successors <= symbols:
        raise ValueError(f"need 1 <= successors ({successors}) <= symbols ({symbols})")
    if not 0 < end_prob <= 1:
        raise ValueError(f"end_prob must be in (0, 1], got {end_prob}")
    rng = np.random.default_rng([seed, 0x6D61726B])
    nxt = np.stack([rng.choice(symbols, successors, replace=False) for _ in range(symbols)])
    probs = rng.dirichlet(np.ones(successors), size=symbols)
    return MarkovChain(symbols, nxt.astype(np.int64), probs, float(end_prob))


def transition_matrix(chain: MarkovChain) -> np.ndarray:
    """The token stream's dense ``(V, V)`` transition matrix, EOD the last state."""
    v = chain.vocab_size
    p = np.zeros((v, v))
    for s in range(chain.symbols):
        np.add.at(p[s], chain.next_symbols[s], (1 - chain.end_prob) * chain.next_probs[s])
        p[s, chain.eod] = chain.end_prob
    p[chain.eod, : chain.symbols] = 1 / chain.symbols
    return p


def stationary(p: np.ndarray) -> np.ndarray:
    """The stationary distribution ``mu = mu P`` of an irreducible chain (a linear solve)."""
    v = p.shape[0]
    a = np.vstack([(p.T - np.eye(v)), np.ones((1, v))])
    b = np.zeros(v + 1)
    b[-1] = 1.0
    mu, *_ = np.linalg.lstsq(a, b, rcond=None)
    return mu


def row_entropies(p: np.ndarray) -> np.ndarray:
    """Entropy in nats of each row of a transition matrix (0 log 0 = 0)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, -p * np.log(p), 0.0)
    return terms.sum(axis=1)


def entropy_rate(chain: MarkovChain) -> float:
    """Nats per token of the document stream: the floor of a language model's loss."""
    p = transition_matrix(chain)
    return float(stationary(p) @ row_entropies(p))


#: Documents generated together from one seed: the unit ranks split, so the corpus
#: does not depend on the number of ranks.
DOCS_PER_BLOCK = 1024


def _block_rng(seed: int, split: int, block: int) -> np.random.Generator:
    key = hashlib.blake2b(struct.pack("<3Q", seed, split, block), digest_size=16).digest()
    return np.random.default_rng(int.from_bytes(key, "little"))


def sample_block(chain: MarkovChain, count: int, rng: np.random.Generator) -> list[np.ndarray]:
    """`count` documents, each ending with EOD, all advanced together step by step."""
    cum = np.cumsum(chain.next_probs, axis=1)
    cum[:, -1] = 1.0
    state = rng.integers(0, chain.symbols, count)
    seqs = [state.copy()]
    alive = np.ones(count, bool)
    lengths = np.zeros(count, np.int64)
    while alive.any():
        lengths[alive] += 1
        ends = rng.random(count) < chain.end_prob
        live = np.minimum(state, chain.symbols - 1)  # finished documents sit on EOD
        pick = (rng.random(count)[:, None] > cum[live]).sum(axis=1)
        state = np.where(alive & ~ends, chain.next_symbols[live, pick], chain.eod)
        alive &= ~ends
        seqs.append(state)
    grid = np.stack(seqs, axis=1)
    return [np.append(grid[i, : lengths[i]], chain.eod).astype(np.int64) for i in range(count)]


def sample_documents(chain: MarkovChain, seed: int, split: int, lo: int, hi: int
                     ) -> list[np.ndarray]:
    """Documents ``[lo, hi)`` of a split, the same whichever rank or process draws them."""
    docs: list[np.ndarray] = []
    for block in range(lo // DOCS_PER_BLOCK, -(-hi // DOCS_PER_BLOCK)):
        first = block * DOCS_PER_BLOCK
        drawn = sample_block(chain, DOCS_PER_BLOCK, _block_rng(seed, split, block))
        docs += drawn[max(lo, first) - first : min(hi, first + DOCS_PER_BLOCK) - first]
    return docs


def stream_nll(chain: MarkovChain, tokens: np.ndarray) -> float:
    """Mean negative log-likelihood, nats per token, of ``tokens[1:]`` given their predecessor
    under the true chain: what a perfect model scores on this stream."""
    p = transition_matrix(chain)
    return float(-np.log(p[tokens[:-1], tokens[1:]]).mean())


def conditional_entropy(tokens: np.ndarray, vocab_size: int, corrected: bool = False) -> float:
    """Plug-in estimate, nats, of the entropy of a token given the one before it, from the
    pair counts of a stream: what a stream says about its chain without knowing the chain
    (a model's samples against its validation file, scripts/check-markov-sampling.py).

    The plug-in estimate is low by about (distinct pairs - distinct predecessors) /
    (2 x pairs) nats; `corrected` adds that back (Miller and Madow's correction)."""
    t = np.asarray(tokens, dtype=np.int64)
    pairs = np.bincount(t[:-1] * vocab_size + t[1:], minlength=vocab_size * vocab_size)
    counts = pairs.reshape(vocab_size, vocab_size).astype(np.float64)
    given = counts.sum(axis=1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(counts > 0, counts * np.log(given / counts), 0.0)
    total = counts.sum()
    bias = ((counts > 0).sum() - (given > 0).sum()) / (2 * total) if corrected else 0.0
    return float(terms.sum() / total + bias)
