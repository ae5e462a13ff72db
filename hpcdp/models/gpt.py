"""A compact decoder-only transformer language model (GPT-2 shape), and its accounting.

Pre-norm blocks (LayerNorm -> causal self-attention -> residual, LayerNorm ->
MLP -> residual), learned position embeddings, a final LayerNorm, and an output
layer that shares the token embedding's weight (tied). Attention is
`torch.nn.functional.scaled_dot_product_attention` with ``is_causal=True``, so
PyTorch picks a fused kernel (flash or memory-efficient) where it has one.

Linear layers and LayerNorms carry biases as GPT-2 does; with the GPT-2 small
shape (`GPTConfig.gpt2_124m`) the model has 124,439,808 parameters, GPT-2
small's count. Weights start from N(0, 0.02); the two projections that write
into the residual stream in each block start 1/sqrt(2 * layers) smaller, so the
residual's variance does not grow with depth (GPT-2's scheme).

Also: `param_groups` (AdamW weight decay on matrices and embeddings only) and
`flops_per_token` (for model FLOPs utilization).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F  # noqa: N812 - the usual name
from torch import nn


@dataclass(frozen=True)
class GPTConfig:
    """The shape of the network. `seq_len` is the longest context it accepts."""

    vocab_size: int
    seq_len: int = 256
    layers: int = 4
    heads: int = 4
    width: int = 128
    mlp_ratio: int = 4
    dropout: float = 0.0

    def __post_init__(self) -> None:
        for name in ("vocab_size", "seq_len", "layers", "heads", "width", "mlp_ratio"):
            if getattr(self, name) < 1:
                raise ValueError(f"gpt {name} must be at least 1, got {getattr(self, name)}")
        if self.width % self.heads:
            raise ValueError(f"gpt width {self.width} is not a multiple of {self.heads} heads")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"gpt dropout must be in [0, 1), got {self.dropout}")

    @classmethod
    def gpt2_124m(cls, vocab_size: int = 50257, seq_len: int = 1024) -> GPTConfig:
        """GPT-2 small: 12 layers, 12 heads, width 768."""
        return cls(vocab_size, seq_len, layers=12, heads=12, width=768)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.qkv = nn.Linear(cfg.width, 3 * cfg.width)
        self.proj = nn.Linear(cfg.width, cfg.width)
        self.dropout = cfg.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        # (b, t, c) -> (b, heads, t, c / heads)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))

    def forward_cached(self, x: torch.Tensor, past: KV | None) -> tuple[torch.Tensor, KV]:
        """Inference on `t` new positions after the cached keys and values `past`.

        Returns the output and the cache extended by the new positions. Not used in
        training: `forward` stays as it is, so training numerics do not depend on this.
        """
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        if past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        seen = k.shape[2] - t  # cached positions before the new ones
        if seen == 0 or t == 1:  # all earlier keys are visible to a single new query
            y = F.scaled_dot_product_attention(q, k, v, is_causal=seen == 0)
        else:  # new query i sees the cache and new keys 0..i
            visible = torch.ones(t, seen + t, dtype=torch.bool, device=x.device).tril(seen)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=visible)
        return self.proj(y.transpose(1, 2).reshape(b, t, c)), (k, v)


#: One layer's cached keys and values, each (batch, heads, positions, width / heads).
KV = tuple[torch.Tensor, torch.Tensor]


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.width)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.width)
        self.fc = nn.Linear(cfg.width, cfg.mlp_ratio * cfg.width)
        self.fc_proj = nn.Linear(cfg.mlp_ratio * cfg.width, cfg.width)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop(self.attn(self.ln1(x)))
        return x + self.drop(self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh")))

    def forward_cached(self, x: torch.Tensor, past: KV | None) -> tuple[torch.Tensor, KV]:
        """`forward` for inference (no dropout) with attention's KV cache."""
        a, kv = self.attn.forward_cached(self.ln1(x), past)
        x = x + a
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh")), kv


class GPT(nn.Module):
    """Token ids ``(batch, t)`` with ``t <= seq_len`` -> logits ``(batch, t, vocab_size)``."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.width)
        self.pos_emb = nn.Embedding(cfg.seq_len, cfg.width)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.ln_f = nn.LayerNorm(cfg.width)
        self.head = nn.Linear(cfg.width, cfg.vocab_size, bias=False)
        self.head.weight = self.tok_emb.weight  # tied: one matrix embeds and predicts
        self.reset_parameters()

    def reset_parameters(self) -> None:
        residual_std = 0.02 / math.sqrt(2 * self.cfg.layers)
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear):
                std = residual_std if name.endswith(("attn.proj", "fc_proj")) else 0.02
                nn.init.normal_(module.weight, 0.0, std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, 0.0, 0.02)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        if t > self.cfg.seq_len:
            raise ValueError(f"sequence of {t} tokens is longer than the model's "
                             f"seq_len {self.cfg.seq_len}")
        pos = torch.arange(t, device=idx.device)
        x = self.drop(self.tok_emb(idx) + self.pos_emb(pos))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))

    def forward_cached(self, idx: torch.Tensor, cache: list[KV] | None = None
                       ) -> tuple[torch.Tensor, list[KV]]:
        """Logits of the new tokens `idx` (batch, t) that follow the positions in `cache`
        (one KV per block, from an earlier call; None: none), and the extended cache.

        For sampling in eval mode: the same function of the tokens as `forward` (up to
        float rounding), each position computed once. Positions are absolute (learned
        embeddings), so the cache cannot go past seq_len: a longer text needs a new
        window (hpcdp.export.sample).
        """
        seen = 0 if cache is None else cache[0][0].shape[2]
        t = idx.shape[1]
        if seen + t > self.cfg.seq_len:
            raise ValueError(f"{seen} cached + {t} new tokens exceed the model's seq_len "
                             f"{self.cfg.seq_len}")
        pos = torch.arange(seen, seen + t, device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(pos)
        out: list[KV] = []
        for i, block in enumerate(self.blocks):
            x, kv = block.forward_cached(x, None if cache is None else cache[i])
            out.append(kv)
        return self.head(self.ln_f(x)), out


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy in nats per target token (float32 even under autocast)."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))


def num_params(model: nn.Module, embeddings: bool = True) -> int:
    """Parameters (the tied matrix once); without the position embeddings if not `embeddings`."""
    total = sum(p.numel() for p in model.parameters())
    if not embeddings and isinstance(model, GPT):
        total -= model.pos_emb.weight.numel()
    return total


def flops_per_token(cfg: GPTConfig, params: int, context: int | None = None) -> float:
    """Training FLOPs per token: ``6 N + 12 L d T`` (forward and backward).

    ``N`` is the parameter count without position embeddings (a lookup, no
    multiplies; the tied token matrix counts, as the output layer multiplies by
    it); ``12 L d T`` is attention's score and weighted-sum matmuls over a
    context of ``T`` tokens (default the model's seq_len), the PaLM paper's
    accounting (Chowdhery et al. 2022, appendix B), causal masking not discounted.
    """
    t = cfg.seq_len if context is None else context
    return 6.0 * params + 12.0 * cfg.layers * cfg.width * t


def mfu(tokens_per_s: float, flops_token: float, peak_flops: float) -> float:
    """Model FLOPs utilization: achieved model FLOP/s over the device's peak."""
    return tokens_per_s * flops_token / peak_flops if peak_flops > 0 else float("nan")


#: Dense bf16 tensor-core peaks, FLOP/s, from the vendors' data sheets (without sparsity),
#: matched against the device name in this order; configure the peak for anything else.
BF16_PEAK_FLOPS = (
    ("H100 PCIe", 756e12), ("H100", 989e12), ("H200", 989e12),
    ("A100", 312e12), ("L40S", 362e12),
)


def peak_flops(device_name: str) -> float | None:
    """The dense bf16 peak of a known GPU by name (torch.cuda.get_device_name), else None."""
    for key, peak in BF16_PEAK_FLOPS:
        if key.lower() in device_name.lower():
            return peak
    return None
