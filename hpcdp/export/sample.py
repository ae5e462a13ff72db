"""Autoregressive sampling from a causal LM: temperature, top-k, a seeded generator, a KV cache.

While the text fits the model's context (seq_len tokens), each new token costs
one position through the network: the keys and values of the earlier positions
are cached (GPT.forward_cached). The GPT's positions are learned and absolute,
so once the text is longer than seq_len the window slides: each further token is
predicted from the last seq_len tokens, recomputed in full (a cached position
would carry the wrong position embedding). `Generation.slid_at` says when that began.

Any other causal LM (a transformers model, a user's builder's: hpcdp.models.named),
whose forward maps (batch, t) ids to logits or to an output with `.logits`, is sampled
without a cache over a window of `window` tokens (the run's lm.seq_len).

The same seed gives the same tokens on the same device and model; cached and
uncached sampling compute the same function (tests/unit/test_sampling.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from hpcdp.models import named
from hpcdp.models.gpt import GPT


@dataclass
class Generation:
    ids: list[int]  # the sampled tokens, without the prompt
    context: int  # the model's window, tokens
    slid_at: int | None  # index in `ids` of the first token predicted from a slid window


def pick(logits: torch.Tensor, temperature: float, top_k: int,
         generator: torch.Generator) -> int:
    """One token id from a row of logits: greedy at temperature 0, else sampled from
    softmax(logits / temperature) over the `top_k` largest (0: all)."""
    if not (math.isfinite(temperature) and temperature >= 0):  # nan fails every comparison
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature}")
    if temperature == 0:
        return int(logits.argmax())
    scaled = logits.double() / temperature
    if 0 < top_k < scaled.numel():
        kth = torch.topk(scaled, top_k).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))


@torch.no_grad()
def generate(model: torch.nn.Module, prompt: Sequence[int], tokens: int,
             temperature: float = 1.0, top_k: int = 0, seed: int = 0, cache: bool = True,
             window: int | None = None) -> Generation:
    """`tokens` ids sampled after `prompt` (at least one id). `cache=False` recomputes the
    whole window for every token (the reference the cached path is tested against); a
    model other than hpcdp's GPT always does, over `window` tokens."""
    if not prompt:
        raise ValueError("the prompt needs at least one token (e.g. the end-of-document id)")
    if tokens < 0:
        raise ValueError(f"tokens must be >= 0, got {tokens}")
    model.eval()
    device = next(model.parameters()).device
    if isinstance(model, GPT):
        window = model.cfg.seq_len
    elif window is None or window < 1:
        raise ValueError(f"a {type(model).__name__} is sampled over a window of tokens: "
                         f"give its length (lm.seq_len), got {window}")
    cache = cache and isinstance(model, GPT)
    generator = torch.Generator(device=device).manual_seed(seed)
    ids, out = [int(t) for t in prompt], Generation([], window, None)
    kv, cached = None, 0  # the cache and how many of `ids` it holds
    for i in range(tokens):
        if cache and len(ids) <= window:
            new = torch.tensor([ids[cached:]], device=device)
            logits, kv = model.forward_cached(new, kv)
            cached = len(ids)
        else:
            if len(ids) > window and out.slid_at is None:
                out.slid_at = i
            logits = named.logits(model(torch.tensor([ids[-window:]], device=device)))
        token = pick(logits[0, -1], temperature, top_k, generator)
        ids.append(token)
        out.ids.append(token)
    return out
