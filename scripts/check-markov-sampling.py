#!/usr/bin/env python
"""Does sampling from the Markov demo's GPT reproduce the chain? (issue 36's check)

    python scripts/check-markov-sampling.py RUN_OR_EXPORT DATA/val.h5 [--tokens 20000]

Samples `--tokens` tokens at temperature 1 (no top-k) from the model, starting a
document, and sets the plug-in entropy of a token given its predecessor in the
samples beside the same estimate on the validation file (and the chain's entropy
rate the file records). A model that learned the chain, sampled without bias,
gives the same figure up to estimation noise; the check fails past --margin nats.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import torch

from hpcdp.data.prep.text.markov import conditional_entropy
from hpcdp.export.generate import open_model
from hpcdp.export.sample import generate


def own_scores(net: torch.nn.Module, stream: np.ndarray) -> tuple[float, float]:
    """(mean -log p_model of each sampled token, mean entropy of the model's prediction at
    each position) over `stream` after its first token, in windows of the model's context
    that overlap by one token. Sampling without bias makes the two equal, up to noise."""
    window, nll, entropy, count = net.cfg.seq_len, 0.0, 0.0, 0
    ids = torch.from_numpy(stream.astype(np.int64))
    with torch.no_grad():
        for start in range(0, len(ids) - 1, window):
            chunk = ids[start:start + window + 1]
            logp = torch.log_softmax(net(chunk[None, :-1])[0].double(), dim=-1)
            nll -= float(logp.gather(1, chunk[1:, None]).sum())
            entropy -= float((logp.exp() * logp).sum())
            count += len(chunk) - 1
    return nll / count, entropy / count


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("source", type=Path, help="run folder, checkpoint or export folder")
    p.add_argument("val", type=Path, help="the validation token file (val.h5)")
    p.add_argument("--tokens", type=int, default=20_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--margin", type=float, default=0.05)
    args = p.parse_args()
    net, config, _ = open_model(args.source)
    torch.set_num_threads(1)  # a token at a time: threads only wait for each other
    vocab, eod = net.cfg.vocab_size, config["tokenizer"]["eod_id"]
    start = time.perf_counter()
    got = generate(net, [eod], args.tokens, temperature=1.0, top_k=0, seed=args.seed)
    secs = time.perf_counter() - start
    with h5py.File(args.val, "r") as f:
        val = f["tokens"][:]
        rate = float(f.attrs.get("entropy_rate_nats", float("nan")))
    stream = np.asarray([eod, *got.ids])
    sampled = conditional_entropy(stream, vocab)
    nll, predicted = own_scores(net, stream)
    fixed = conditional_entropy(stream, vocab, corrected=True)
    reference = conditional_entropy(val, vocab)
    gap = sampled - reference
    print(f"sampled     {sampled:.4f} nats (H(next | previous), {len(got.ids)} tokens, "
          f"seed {args.seed}, {secs:.1f}s, window slid from token {got.slid_at})")
    print(f"  corrected {fixed:.4f} nats (Miller-Madow: plus the plug-in bias of rare pairs)")
    print(f"model       {nll:.4f} nats: its loss on its samples; {predicted:.4f} nats: the mean "
          "entropy of its predictions there (equal when sampling is unbiased)")
    print(f"validation  {reference:.4f} nats ({len(val)} tokens of {args.val})")
    print(f"chain       {rate:.4f} nats (entropy rate recorded in the file)")
    print(f"gap         {gap:+.4f} (target |gap| <= {args.margin})")
    return 0 if abs(gap) <= args.margin else 1


if __name__ == "__main__":
    sys.exit(main())
