"""Train the GPT on a Markov corpus in one process and compare its loss with the floor.

No trainer, no Horovod: the token reader, the model, AdamW with decay groups,
gradient clipping, warmup + cosine. Prints the training loss as it goes and the
validation loss next to the file's ``entropy_rate_nats`` at the end.

    python datasets/markov.py --out data/markov
    python scripts/lm_markov_check.py --data data/markov --steps 600
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from hpcdp.data.format import tokens as tk
from hpcdp.data.read.tokens import TokenReader
from hpcdp.models import gpt
from hpcdp.optim.groups import param_groups


def lr_at(step: int, steps: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


@torch.no_grad()
def evaluate(model: gpt.GPT, path: Path, seq_len: int, batch: int) -> float:
    """Mean loss, nats per token, over every window of the validation file."""
    model.eval()
    reader = TokenReader(path, seq_len=seq_len, batch_size=batch, prefetch=0)
    total, count = 0.0, 0
    for x, y in reader.eval_batches():
        total += gpt.lm_loss(model(x), y).item() * y.numel()
        count += y.numel()
    reader.close()
    model.train()
    return total / count


def train(data: Path, steps: int, seq_len: int, batch: int, cfg: gpt.GPTConfig, lr: float,
          seed: int, log_every: int) -> dict[str, float]:
    torch.manual_seed(seed)
    model = gpt.GPT(cfg)
    opt = torch.optim.AdamW(param_groups(model, 0.1, adaptive=False), lr=lr, betas=(0.9, 0.95))
    reader = TokenReader(data / "train.h5", seq_len=seq_len, batch_size=batch, seed=seed)
    step, epoch, start = 0, 0, time.perf_counter()
    while step < steps:
        reader.set_epoch(epoch)
        for x, y in reader:
            for group in opt.param_groups:
                group["lr"] = lr_at(step, steps, lr, max(1, steps // 20))
            loss = gpt.lm_loss(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            step += 1
            if log_every and step % log_every == 0:
                print(f"step {step} loss {loss.item():.4f}", flush=True)
            if step == steps:
                break
        epoch += 1
    seconds = time.perf_counter() - start
    reader.close()
    val = evaluate(model, data / "val.h5", seq_len, batch)
    floor = float(tk.validate_tokens(data / "val.h5").attrs["entropy_rate_nats"])
    return {"val_loss": val, "entropy_rate_nats": floor, "gap": val - floor,
            "train_seconds": seconds, "steps": steps,
            "tokens_per_s": steps * batch * seq_len / seconds}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, required=True, help="folder with train.h5, val.h5")
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=100)
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (1: a model this small gains nothing from more, and on "
                        "a busy machine spinning threads cost more than they give)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    vocab = tk.validate_tokens(args.data / "train.h5").vocab_size
    cfg = gpt.GPTConfig(vocab, args.seq_len, args.layers, args.heads, args.width)
    result = train(args.data, args.steps, args.seq_len, args.batch, cfg, args.lr, args.seed,
                   args.log_every)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
