"""The tiny GPT learns a Markov corpus from the token reader, in one process, within seconds.

No trainer: the reader, the model, AdamW with decay groups. The loss on held-out
documents must fall most of the way from the no-context (unigram) entropy to
the chain's entropy rate, which no model can beat.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from hpcdp.data.format import tokens as tk
from hpcdp.data.prep.text import markov as mk
from hpcdp.data.read.tokens import TokenReader
from hpcdp.models import gpt
from hpcdp.optim.groups import param_groups


def write_split(path: Path, chain: mk.MarkovChain, split: int, docs: int) -> None:
    meta = tk.TokenMeta(chain.vocab_size, chain.eod, "markov", "00" * 32)
    tk.write_tokens(path, mk.sample_documents(chain, 0, split, 0, docs), meta)


def unigram_entropy(path: Path) -> float:
    import h5py

    with h5py.File(path) as f:
        counts = np.bincount(f["tokens"][...])
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


@pytest.mark.slow
def test_tiny_gpt_approaches_the_entropy_rate(tmp_path: Path) -> None:
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    chain = mk.random_chain(16, 2, 0.1, seed=3)
    write_split(tmp_path / "train.h5", chain, 0, 3000)
    write_split(tmp_path / "val.h5", chain, 1, 300)
    floor, unigram = mk.entropy_rate(chain), unigram_entropy(tmp_path / "val.h5")
    model = gpt.GPT(gpt.GPTConfig(chain.vocab_size, seq_len=32, layers=1, heads=2, width=32))
    opt = torch.optim.AdamW(param_groups(model, 0.01, adaptive=False), lr=1e-2)
    reader = TokenReader(tmp_path / "train.h5", seq_len=32, batch_size=16, prefetch=0)
    try:
        for x, y in reader:  # one epoch: about 230 steps
            loss = gpt.lm_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        with torch.no_grad():
            val = TokenReader(tmp_path / "val.h5", seq_len=32, batch_size=16, prefetch=0)
            scored = [(gpt.lm_loss(model(x), y).item() * y.numel(), y.numel())
                      for x, y in val.eval_batches()]
    finally:
        torch.set_num_threads(threads)
    val_loss = sum(s for s, _ in scored) / sum(n for _, n in scored)
    print(f"val loss {val_loss:.4f}, entropy rate {floor:.4f}, unigram {unigram:.4f}")
    assert floor - 0.05 < val_loss < floor + 0.1 * (unigram - floor)
