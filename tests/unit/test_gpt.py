"""The GPT network: shapes, causality, tied weights, GPT-2 small's parameter count, groups."""

from __future__ import annotations

import pytest
import torch

from hpcdp.models import gpt

TINY = gpt.GPTConfig(vocab_size=50, seq_len=16, layers=2, heads=2, width=16)


def test_shapes_and_loss() -> None:
    torch.manual_seed(0)
    model = gpt.GPT(TINY)
    idx = torch.randint(0, 50, (3, 16))
    logits = model(idx)
    assert logits.shape == (3, 16, 50)
    assert model(idx[:, :5]).shape == (3, 5, 50)
    loss = gpt.lm_loss(logits, torch.randint(0, 50, (3, 16)))
    assert loss.ndim == 0 and abs(loss.item() - torch.log(torch.tensor(50.0)).item()) < 0.2
    with pytest.raises(ValueError, match="longer than the model's seq_len 16"):
        model(torch.zeros(1, 17, dtype=torch.long))


def test_changing_a_future_token_leaves_earlier_logits_alone() -> None:
    torch.manual_seed(1)
    model = gpt.GPT(TINY).eval()
    idx = torch.randint(0, 50, (2, 16))
    changed = idx.clone()
    changed[:, 9] = (changed[:, 9] + 1) % 50
    a, b = model(idx), model(changed)
    torch.testing.assert_close(a[:, :9], b[:, :9], rtol=0, atol=1e-6)
    assert (a[:, 9:] - b[:, 9:]).abs().max() > 1e-4


def test_output_layer_is_the_token_embedding() -> None:
    model = gpt.GPT(TINY)
    assert model.head.weight is model.tok_emb.weight
    names = [n for n, _ in model.named_parameters()]
    assert "head.weight" not in names and "tok_emb.weight" in names


def test_gpt2_small_shape_has_gpt2_small_parameter_count() -> None:
    with torch.device("meta"):
        model = gpt.GPT(gpt.GPTConfig.gpt2_124m())
    assert gpt.num_params(model) == 124_439_808
    assert gpt.num_params(model, embeddings=False) == 124_439_808 - 1024 * 768


def test_flops_per_token() -> None:
    cfg = gpt.GPTConfig.gpt2_124m()
    n = 124_439_808 - 1024 * 768
    assert gpt.flops_per_token(cfg, n) == 6 * n + 12 * 12 * 768 * 1024
    assert gpt.mfu(1000.0, 1e9, 1e12) == pytest.approx(1.0)
    assert gpt.peak_flops("NVIDIA H200") == gpt.peak_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert gpt.peak_flops("NVIDIA H100 PCIe") == 756e12
    assert gpt.peak_flops("NVIDIA A100-SXM4-80GB") == 312e12
    assert gpt.peak_flops("cpu") is None


def test_residual_projections_start_smaller() -> None:
    torch.manual_seed(0)
    model = gpt.GPT(gpt.GPTConfig(vocab_size=50, seq_len=8, layers=8, heads=2, width=64))
    blk = model.blocks[0]
    assert blk.fc_proj.weight.std().item() < 0.6 * blk.fc.weight.std().item()
    assert blk.attn.proj.weight.std().item() < 0.6 * blk.attn.qkv.weight.std().item()


def test_bad_shapes() -> None:
    with pytest.raises(ValueError, match="width 10 is not a multiple of 3 heads"):
        gpt.GPTConfig(vocab_size=5, width=10, heads=3)
