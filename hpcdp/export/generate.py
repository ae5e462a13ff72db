"""`hpcdp generate (RUN_DIR | EXPORT_DIR)`: sample from a trained language model.

    hpcdp generate runs/lm --prompt "def " --tokens 200 --temperature 0.8 --top-k 40 --seed 1

An export folder is read with hpcdp.export.load; a run folder (or checkpoint file)
is read as a resume would read its newest checkpoint. Text is decoded with the
run's tokenizer (bytes, BPE, tokenizer.json); `--ids` writes the sampled ids as a
.npy file instead (the only output for tokenizers without text, such as the
Markov demo's symbols). Sampling: hpcdp.export.sample.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hpcdp.export import bundle, text
from hpcdp.export.load import load
from hpcdp.export.sample import generate
from hpcdp.models.gpt import GPT


def is_export(path: Path) -> bool:
    return (path / bundle.CONFIG).is_file()


def open_model(source: Path, allow_group_write: bool = False
               ) -> tuple[torch.nn.Module, dict[str, Any], str | None]:
    """(model, export config, tokenizer.json text) of an export folder, run or checkpoint."""
    if is_export(source):
        net, config = load(source)
        return net, config, bundle.read_tokenizer(source, config)
    # A run folder or checkpoint: read as resume does (imports the training side).
    from hpcdp.export.command import data_attrs, export_config
    from hpcdp.train import checkpoint_trust as cktrust
    from hpcdp.train.trained import load as load_trained

    trained = load_trained(source, cktrust.Trust(allow_group_write))
    config, tokenizer_json = export_config(trained, data_attrs(trained.config))
    return trained.model, config, tokenizer_json


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="hpcdp generate",
        description="Sample tokens from a trained language model (hpcdp's GPT with a KV cache "
        "while the text fits the context; past it, the window slides over the last seq_len "
        "tokens; other models recompute the window for each token).")
    p.add_argument("source", type=Path, help="an export folder, a run folder or a checkpoint")
    p.add_argument("--prompt", default="", help="text to continue (ids as numbers for a "
                   "tokenizer without text); empty: start a document")
    p.add_argument("--tokens", type=int, default=200, help="tokens to sample (default 200)")
    p.add_argument("--temperature", type=float, default=1.0,
                   help="softmax temperature; 0: greedy (default 1)")
    p.add_argument("--top-k", type=int, default=0, help="sample among the k likeliest; "
                   "0: all (default)")
    p.add_argument("--seed", type=int, default=0, help="the same seed gives the same tokens")
    p.add_argument("--out", type=Path, help="write here instead of stdout (with --ids: "
                   "the .npy file; default generated.npy)")
    p.add_argument("--ids", action="store_true", help="write the sampled token ids as .npy")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    p.add_argument("--no-cache", action="store_true",
                   help="recompute the whole window for every token (slower; for checks)")
    p.add_argument("--allow-group-write", action="store_true",
                   help="accept a checkpoint or folder that your group can write")
    from hpcdp.cliargs import parse_args

    args = parse_args(p, argv)
    problem = option_problem(args.temperature, args.tokens, args.top_k)
    if problem:
        p.error(problem)
    return args


def option_problem(temperature: float, tokens: int, top_k: int) -> str | None:
    """What is wrong with the sampling options, before any model is read (None: nothing)."""
    if not (math.isfinite(temperature) and temperature >= 0):
        return f"--temperature {temperature}: expected a finite number >= 0 (0: greedy)"
    if tokens < 0:
        return f"--tokens {tokens}: expected a count >= 0"
    if top_k < 0:
        return f"--top-k {top_k}: expected a count >= 0 (0: all tokens)"
    return None


def window_and_vocab(net: torch.nn.Module, config: dict[str, Any], source: Path
                     ) -> tuple[int, int]:
    """(context window, vocabulary) of a language model: the GPT's own, else the token
    inputs config.json describes (a transformers model, a builder's: lm.seq_len and
    lm.vocab_size as the run recorded them)."""
    if isinstance(net, GPT):
        return net.cfg.seq_len, net.cfg.vocab_size
    inputs = config.get("input") or {}
    window, vocab = inputs.get("seq_len"), inputs.get("vocab_size")
    if inputs.get("kind") != "tokens" or not isinstance(window, int) \
            or not isinstance(vocab, int):
        raise text.TextError(f"{source}: a {config['task']!r} model without token inputs; "
                             "generate samples from language models (task lm)")
    return window, vocab


def run(args: argparse.Namespace) -> int:
    net, config, tokenizer_json = open_model(args.source, args.allow_group_write)
    window, vocab = window_and_vocab(net, config, args.source)
    codec = text.codec(config.get("tokenizer"), tokenizer_json)
    prompt = codec.encode(args.prompt)
    if any(not 0 <= t < vocab for t in prompt):
        raise text.TextError(f"the prompt holds ids outside the vocabulary 0..{vocab - 1}")
    net = net.to(args.device)
    small = net.cfg.width <= 1024 if isinstance(net, GPT) else \
        sum(p.numel() for p in net.parameters()) <= 50_000_000
    if small and "OMP_NUM_THREADS" not in os.environ:
        # One token at a time of a small model is too little work to split over threads:
        # on a busy node the threads' waits cost 30x a single thread's time.
        torch.set_num_threads(1)
    got = generate(net, prompt, args.tokens, args.temperature, args.top_k, args.seed,
                   cache=not args.no_cache, window=window)
    if len(prompt) > got.context:
        print(f"note: the prompt has {len(prompt)} tokens; the model reads the last "
              f"{got.context}", file=sys.stderr)
    if got.slid_at is not None:
        print(f"note: the context window ({got.context} tokens) filled at sampled token "
              f"{got.slid_at}: from there each token is predicted from the last "
              f"{got.context} tokens (sliding window)", file=sys.stderr)
    if args.ids:
        out = args.out or Path("generated.npy")
        np.save(out, np.asarray(got.ids, dtype=np.int64))
        print(f"wrote {len(got.ids)} token ids to {out}", file=sys.stderr)
        return 0
    # Without text (the Markov symbols) the ids are written as numbers.
    sampled = codec.decode(prompt if args.prompt else []) + codec.decode(got.ids)
    if args.out:
        args.out.write_text(sampled)
    else:
        print(sampled)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    from hpcdp.train.checkpoint_format import CheckpointError

    try:
        return run(args)
    except (ValueError, CheckpointError, OSError) as e:  # ExportError, TextError, SpecError..
        print(f"hpcdp generate: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
