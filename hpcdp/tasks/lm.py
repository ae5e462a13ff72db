"""Language modelling: a GPT (hpcdp.models.gpt), a transformers causal LM or a user's
builder's network (hpcdp.models.named) on token windows (hpcdp.data.format.tokens).

Reads `data.train_file` and `data.val_file` as token files: training through the
TokenReader (shuffled windows of `lm.seq_len` + 1 tokens, equal steps, exact
resume), validation over every window of the validation file once
(`TokenReader.eval_batches`). The model's vocabulary is the training file's
(lm.vocab_size, filled in at start); outputs with `.logits` (transformers) are read there.
Loss: mean cross-entropy in nats per target token; perplexity is exp of the
loss reduced over all ranks and batches. Throughput adds tokens/s and, where a
peak is known (a listed GPU, or `lm.peak_tflops`), the model FLOPs utilization.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hpcdp.config import Config, ConfigError, TaskSection, at_least_one, free_table, not_negative
from hpcdp.data.read.protocol import ReadOptions, TrainingReader
from hpcdp.models import gpt, named
from hpcdp.tasks import Dataset, Metric, Task, default_optimizers, read_options


@dataclass
class LMConfig:
    """The language-model task: token windows, the GPT's shape, throughput accounting."""

    seq_len: int = 64  # S: tokens of context per window (each window reads S + 1)
    layers: int = 2  # transformer blocks
    heads: int = 2  # attention heads (width must be a multiple)
    width: int = 64  # the residual stream's width
    mlp_ratio: int = 4  # MLP hidden width = mlp_ratio x width
    dropout: float = 0.0  # on attention, residual and embeddings; 0 for determinism
    tokenizer_sha256: str = ""  # if set: the data must be made with this tokenizer
    peak_tflops: float = 0.0  # device peak for MFU, TFLOP/s; 0: known GPUs detected, else none
    # the model's vocabulary (token ids 0..vocab_size-1); 0: the training file's, filled in
    # at start and recorded with the run (the model is rebuilt from the config alone)
    vocab_size: int = 0


def check(cfg: Config) -> None:
    c = cfg.lm
    at_least_one({"lm.seq_len": c.seq_len, "lm.layers": c.layers, "lm.heads": c.heads,
                  "lm.width": c.width, "lm.mlp_ratio": c.mlp_ratio})
    not_negative({"lm.peak_tflops": c.peak_tflops, "lm.vocab_size": c.vocab_size})
    if cfg.model.kwargs and ":" not in cfg.model.name:
        raise ConfigError(f"model.kwargs is for a named network (transformers:, a builder); "
                          f"model.name={cfg.model.name!r} takes its shape from [lm]")
    if c.width % c.heads:
        raise ConfigError(f"lm.width={c.width} is not a multiple of lm.heads={c.heads}")
    if not 0.0 <= c.dropout < 1.0:
        raise ConfigError(f"lm.dropout={c.dropout}: must lie in [0, 1)")
    sha = c.tokenizer_sha256
    if sha and not re.fullmatch(r"[0-9a-f]{64}", sha):
        raise ConfigError(f"lm.tokenizer_sha256={sha!r}: 64 lower-case hex digits, or empty")


def datasets(cfg: Config) -> Sequence[Dataset]:
    return (Dataset("tokens", "tokens", kinds="u"),)


def gpt_config(cfg: Config, vocab_size: int) -> gpt.GPTConfig:
    c = cfg.lm
    return gpt.GPTConfig(vocab_size, c.seq_len, c.layers, c.heads, c.width, c.mlp_ratio,
                         c.dropout)


def train_path(cfg: Config) -> Path:
    return Path(cfg.data.path) / cfg.data.train_file


def vocab_size(cfg: Config) -> int:
    """lm.vocab_size, or where it is 0 (a config not yet through `from_data`) the
    training file's vocabulary, read from its attributes."""
    if cfg.lm.vocab_size:
        return cfg.lm.vocab_size
    from hpcdp.data.format import tokens as tk

    return tk.validate_tokens(train_path(cfg)).vocab_size


def model(cfg: Config, sample_shape: tuple[int, ...]) -> torch.nn.Module:
    """The GPT, a transformers causal LM (transformers:<ConfigClass>) or a user's builder's
    network (hpcdp.models.named), for the vocabulary of lm.vocab_size."""
    name, kwargs = cfg.model.name, cfg.model.kwargs
    reference = named.parse(name)
    if reference is None:
        return gpt.GPT(gpt_config(cfg, vocab_size(cfg)))
    if reference.kind == "builder":
        return named.user_network(name, reference, kwargs, cfg, sample_shape)
    if reference.kind == "transformers":
        return named.causal_lm(name, kwargs, vocab_size(cfg), cfg.lm.seq_len)
    raise named.ModelError(f"model.name={name!r}: the lm task builds transformers: causal "
                           "LMs or a builder of yours (package.module:callable)")


def from_data(cfg: Config, path: Path) -> Config:
    """The config with lm.vocab_size the training file's (a larger one set by hand is kept),
    and a transformers config file (transformers:<file>.json) read into model.kwargs and
    named by its class: the run records a config that rebuilds the model by itself."""
    from hpcdp.data.format import tokens as tk

    found = tk.validate_tokens(path).vocab_size
    if cfg.lm.vocab_size and cfg.lm.vocab_size < found:
        raise ConfigError(f"lm.vocab_size={cfg.lm.vocab_size}, but {path} holds token ids up "
                          f"to {found - 1}: set at least {found}, or 0 (the file's)")
    lm_values = dataclasses.replace(cfg.lm, vocab_size=cfg.lm.vocab_size or found)
    cfg = dataclasses.replace(cfg, task_section=("lm", lm_values))
    reference = named.parse(cfg.model.name)
    if reference is None or reference.kind != "transformers" \
            or not reference.target.endswith(".json"):
        return cfg
    return dataclasses.replace(cfg, model=folded_config_file(cfg.model))


def folded_config_file(model_cfg: Any) -> Any:
    """model.name = transformers:<file>.json as transformers:<its class> with the file's
    values under model.kwargs (model.kwargs win). The file's vocab_size gives way to the
    data's, and keys it sets to null are left to the class's defaults (TOML has no null)."""
    name = model_cfg.name
    path = named.parse(name).target
    values = named.config_json(name, path)
    cls = named.class_for_type(name, values.pop("model_type"))
    kept = {k: v for k, v in values.items() if v is not None and k != "vocab_size"}
    try:
        kwargs = free_table(f"{path}", {**kept, **model_cfg.kwargs})
    except ConfigError as e:
        raise named.ModelError(f"model.name={name!r}: {e}") from None
    return dataclasses.replace(model_cfg, name=f"transformers:{cls}", kwargs=kwargs)


class Validation:
    """This rank's share of every validation window, iterable afresh for each validation."""

    def __init__(self, reader: Any, batch_size: int) -> None:
        self.reader, self.batch_size = reader, batch_size

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return self.reader.eval_batches(self.batch_size)

    def close(self) -> None:
        self.reader.close()


def readers(cfg: Config, rank: int, size: int, batch: int,
            device: torch.device) -> tuple[TrainingReader, Validation]:
    """TokenReaders for both splits; every check (validate_tokens) runs here, on every rank."""
    from hpcdp.data.read.tokens import TokenReader

    sha = cfg.lm.tokenizer_sha256 or None
    root = Path(cfg.data.path)
    train = TokenReader(root / cfg.data.train_file, read_options(cfg, batch, rank, size),
                        seq_len=cfg.lm.seq_len, tokenizer_sha256=sha)
    val = validation_reader(cfg, root / cfg.data.val_file, rank, size, batch)
    if val.reader.vocab_size != train.vocab_size:
        from hpcdp.data.read.tokens import TokenReaderError

        raise TokenReaderError(f"{val.reader.path}: vocabulary {val.reader.vocab_size}, but "
                               f"{train.path} has {train.vocab_size}")
    return train, val


def validation_reader(cfg: Config, path: Path, rank: int, size: int, batch: int) -> Validation:
    """Every window of the token file `path` once over the ranks, val_batch_size at a time."""
    from hpcdp.data.read.tokens import TokenReader

    # One window per rank at least (batch 1 here); validation batches are val_batch_size.
    val = TokenReader(path, ReadOptions(batch_size=1, rank=rank, world_size=size, prefetch=0),
                      seq_len=cfg.lm.seq_len, tokenizer_sha256=cfg.lm.tokenizer_sha256 or None)
    return Validation(val, cfg.data.val_batch_size or batch)


def prepare(batch: Any, cfg: Config, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    inputs, targets = batch
    return inputs.to(device, non_blocking=True), targets.to(device, non_blocking=True)


def loss(out: Any, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy per target token of the logits (the output, or its `.logits`)."""
    return gpt.lm_loss(named.logits(out), targets)


def measure(out: Any, targets: torch.Tensor, mean_loss: torch.Tensor
            ) -> Mapping[str, torch.Tensor]:
    """The batch's summed loss over its target tokens (mean x tokens)."""
    return {"loss": mean_loss.detach().double() * targets.numel()}


def count(targets: torch.Tensor) -> int:
    """Mean metrics are per target token."""
    return targets.numel()


def derive(values: Mapping[str, Any]) -> dict[str, float]:
    """Perplexity: exp of the mean loss over every token of every rank (not a mean of exps)."""
    if "loss" not in values:
        return {}
    loss = float(values["loss"])
    return {"perplexity": math.exp(loss) if loss < 700 else float("inf")}


def peak_flops(cfg: Config, device: torch.device) -> float | None:
    """FLOP/s of one device: configured, else a known GPU's bf16 peak, else None."""
    if cfg.lm.peak_tflops > 0:
        return cfg.lm.peak_tflops * 1e12
    if device.type == "cuda":
        return gpt.peak_flops(torch.cuda.get_device_name(device))
    return None


def rates(cfg: Config, net: torch.nn.Module, samples_per_s: float, ranks: int,
          device: torch.device) -> dict[str, float]:
    """tokens/s over all `ranks`, and MFU (per device: one rank's share) where a peak is known."""
    tokens_per_s = samples_per_s * cfg.lm.seq_len
    out = {"tokens_per_s": tokens_per_s}
    peak = peak_flops(cfg, device)
    if peak and isinstance(net, gpt.GPT):
        flops = gpt.flops_per_token(net.cfg, gpt.num_params(net, embeddings=False))
        out["mfu"] = gpt.mfu(tokens_per_s / max(ranks, 1), flops, peak)
    return out


TASK = Task(
    name="lm",
    models=("gpt",),
    datasets=datasets,
    build_model=model,
    prepare=prepare,
    loss=loss,
    measure=measure,
    metrics=(Metric("loss", "mean"),),
    optimizers=default_optimizers,
    count=count,
    defaults={
        "model": {"name": "gpt"},
        "optim": {"name": "adamw", "lr": 3e-3, "betas": [0.9, 0.95], "weight_decay": 0.1,
                  "grad_clip": 1.0, "lr_scaling": "none"},
        "schedule": {"kind": "cosine", "min_factor": 0.1},
    },
    readers=readers,
    validation_reader=validation_reader,
    derive=derive,
    rates=rates,
    from_data=from_data,
    named=("transformers", "builder"),
    section=TaskSection("lm", LMConfig, check),
)
