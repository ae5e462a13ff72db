"""The GPT-2 124M shape in `hpcdp bench train` (`--models gpt2_124m`).

12 layers, 12 heads, width 768, vocabulary 50,257, windows of 1,024 tokens: the
shape at which the language model's data share of the step time (the reader's
hand-over and the copy onto the device, over the step) must stay under 2%. The
tokens are uniform random ids in a token file of that vocabulary, written by one
process (speed does not depend on what the tokens say, and the Markov corpus's
vocabulary is 65). Tokens/s count the target tokens of each window.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hpcdp.data.format import tokens as tk

SHAPE = {"layers": 12, "heads": 12, "width": 768}
SEQ_LEN = 1024
VOCAB = 50257
DOC_TOKENS = 4096  # tokens per synthetic document (each ends with the end token)


def overrides() -> list[str]:
    """`hpcdp train` overrides on top of hpcdp/configs/lm_markov.toml: the shape."""
    return [f"lm.{k}={v}" for k, v in SHAPE.items()] + [
        f"lm.seq_len={SEQ_LEN}", "data.global_batch_size=0", "data.val_batch_size=1"]


def ddp_args() -> list[str]:
    """The same shape for the DDP reference (hpcdp.bench.ddp_reference)."""
    return [f"--{k}={v}" for k, v in SHAPE.items()] + [f"--seq-len={SEQ_LEN}"]


def windows_needed(steps: int, batch: int, ranks: int) -> int:
    """Windows for `steps` steps of `batch` windows on each of `ranks` ranks in one epoch,
    and one more global batch (an epoch's end would add a validation pass)."""
    return (steps + 1) * batch * ranks


def tokens_for(windows: int, seq_len: int = SEQ_LEN) -> int:
    """Tokens that hold `windows` windows of seq_len + 1 tokens starting every seq_len."""
    return windows * seq_len + 1


def write_corpus(out: Path, windows: int, val_windows: int = 2, seed: int = 0) -> Path:
    """train.h5 and val.h5 of uniform random tokens in the GPT-2 vocabulary; `out`."""
    rng = np.random.default_rng(seed)
    eod = VOCAB - 1
    out.mkdir(parents=True, exist_ok=True)
    for split, count in (("train", windows), ("val", val_windows)):
        n = tokens_for(count)
        docs = [np.append(rng.integers(0, eod, size=min(DOC_TOKENS, n - i) - 1), eod)
                for i in range(0, n, DOC_TOKENS)]
        meta = tk.TokenMeta(vocab_size=VOCAB, eod_id=eod, tokenizer="synthetic-uniform",
                            tokenizer_sha256="", split=split, source="hpcdp bench train",
                            source_params={"seed": seed, "windows": count})
        tk.write_tokens(out / f"{split}.h5", docs, meta)
    return out
