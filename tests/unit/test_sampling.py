"""Sampling from the GPT: the KV cache computes what the full forward does; seeds repeat."""

from __future__ import annotations

import pytest
import torch

from hpcdp.export import text
from hpcdp.export.sample import generate, pick
from hpcdp.models.gpt import GPT, GPTConfig


def tiny_gpt(dtype: torch.dtype = torch.float64) -> GPT:
    torch.manual_seed(0)
    net = GPT(GPTConfig(vocab_size=29, seq_len=16, layers=2, heads=2, width=16))
    with torch.no_grad():  # larger weights than the init: peaked, varied distributions
        for p in net.parameters():
            p.mul_(8.0)
    return net.to(dtype).eval()


def test_cached_forward_is_the_full_forward() -> None:
    net = tiny_gpt()
    idx = torch.randint(0, 29, (2, 16), generator=torch.Generator().manual_seed(1))
    full = net(idx)
    logits, cache = net.forward_cached(idx[:, :5])  # a prompt of 5
    parts = [logits]
    more, cache = net.forward_cached(idx[:, 5:9], cache)  # several new positions at once
    parts.append(more)
    for t in range(9, 16):  # then one at a time
        one, cache = net.forward_cached(idx[:, t:t + 1], cache)
        parts.append(one)
    torch.testing.assert_close(torch.cat(parts, 1), full, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="exceed the model's seq_len 16"):
        net.forward_cached(idx[:, :1], cache)


def test_cached_and_uncached_sampling_give_the_same_tokens() -> None:
    net = tiny_gpt()
    cached = generate(net, [3, 4, 5], 40, temperature=1.0, top_k=0, seed=11)
    plain = generate(net, [3, 4, 5], 40, temperature=1.0, top_k=0, seed=11, cache=False)
    assert cached.ids == plain.ids
    # 3 + 13 sampled tokens fill the 16-token window; the next one already slid
    assert cached.slid_at == plain.slid_at == 14
    assert len(set(cached.ids)) > 5  # sampled, not one repeated token


def test_the_same_seed_gives_the_same_tokens() -> None:
    net = tiny_gpt(torch.float32)
    a = generate(net, [1], 30, temperature=0.9, top_k=10, seed=5)
    b = generate(net, [1], 30, temperature=0.9, top_k=10, seed=5)
    c = generate(net, [1], 30, temperature=0.9, top_k=10, seed=6)
    assert a.ids == b.ids
    assert a.ids != c.ids


def test_top_one_is_greedy() -> None:
    net = tiny_gpt()
    assert generate(net, [2], 20, 1.0, 1, seed=1).ids == generate(net, [2], 20, 0.0, 0).ids


def test_top_k_samples_only_the_k_likeliest() -> None:
    logits = torch.tensor([0.0, 3.0, 1.0, 2.9, -1.0])
    g = torch.Generator().manual_seed(0)
    drawn = {pick(logits, 5.0, 2, g) for _ in range(300)}
    assert drawn == {1, 3}


def test_bytes_text_round_trip_and_the_end_of_document() -> None:
    codec = text.codec({"name": "bytes", "eod_id": 256}, None)
    ids = codec.encode("héllo")
    assert codec.decode([*ids, 256, *codec.encode("x")]) == "héllo" + text.END_MARK + "x"
    assert codec.encode("") == [256]


def test_ids_without_text() -> None:
    codec = text.codec({"name": "markov-64", "eod_id": 64}, None)
    assert codec.encode("3 17 5") == [3, 17, 5] and codec.decode([3, 4]) == "3 4"
    with pytest.raises(text.TextError, match="token ids separated by spaces"):
        codec.encode("hello")
