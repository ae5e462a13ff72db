"""What `hpcdp bench train` runs for each `--models` name: its data, config and overrides.

A name may stand for several setups: `dlrm` for each table size under each
gradient mode (hpcdp.bench.train_recsys). Each setup is measured on 1 and on 2
ranks and summarized under its own label.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hpcdp.bench import common, train_lm, train_recsys

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
MODELS = ("digits_cnn", "resnet18", "gpt", "gpt2_124m", "dlrm")
DEFAULT_MODELS = ("digits_cnn", "resnet18", "gpt")  # `make bench`: a few minutes in all
#: Rows (windows for a language model) per rank when --batch is not given.
DEFAULT_BATCH = {"dlrm": 256, "gpt2_124m": 1}
IMAGE_MODELS = ("digits_cnn", "resnet18")


@dataclass(frozen=True)
class Setup:
    """One configuration of the benchmark: measured on 1 and 2 ranks under `label`."""

    label: str  # its name in the tables and the JSON
    model: str  # model.name for `hpcdp train`
    data: str  # key of its prepared data (prepare_data)
    config: Path | None  # the config file the run starts from
    overrides: tuple[str, ...] = ()
    batch: int = 32  # per rank
    seq_len: int | None = None  # a language model's target tokens per window

    @property
    def has_ddp(self) -> bool:
        """Whether hpcdp.bench.ddp_reference builds this model."""
        return self.model in (*IMAGE_MODELS, "gpt")

    @property
    def has_bare(self) -> bool:
        """Whether the bare loop (an image classifier's) applies."""
        return self.model in IMAGE_MODELS


def setups(models: Sequence[str], args: argparse.Namespace) -> list[Setup]:
    """The setups of `models` in order; `args.batch` (None: each model's default),
    `args.seq_len` (the small GPT's), `args.tables` (the click model's table sizes)."""
    def batch(name: str) -> int:
        return args.batch or DEFAULT_BATCH.get(name, 32)

    found: list[Setup] = []
    for name in models:
        if name in IMAGE_MODELS:
            config = CONFIGS / "digits.toml" if name == "digits_cnn" else None
            found.append(Setup(name, name, name, config, batch=batch(name)))
        elif name == "gpt":
            found.append(Setup(name, "gpt", name, CONFIGS / "lm_markov.toml",
                               (f"lm.seq_len={args.seq_len}", "data.global_batch_size=0"),
                               batch(name), args.seq_len))
        elif name == "gpt2_124m":
            found.append(Setup(name, "gpt", name, CONFIGS / "lm_markov.toml",
                               tuple(train_lm.overrides()), batch(name), train_lm.SEQ_LEN))
        elif name == "dlrm":
            found += [Setup(v.label, "dlrm", f"dlrm_{v.tables}", train_recsys.CONFIG,
                            tuple(train_recsys.overrides(v)), batch(name))
                      for v in train_recsys.variants(args.tables)]
        else:
            raise ValueError(f"unknown model {name!r}; choose from {', '.join(MODELS)}")
    return found


def prep_commands(key: str, out: Path, args: argparse.Namespace,
                  batch: int) -> list[list[str]] | None:
    """Commands that write the data `key` into `out`; None: written in this process."""
    py = sys.executable
    if key == "digits_cnn":
        return [[py, "-m", "hpcdp.data.prep.cli", "digits", "--out", str(out)]]
    if key == "resnet18":
        return [[py, "-m", "hpcdp.data.prep.cli", "synthetic", "--samples", str(args.samples),
                 "--val-samples", "256", "--shape", "3,32,32", "--dtype", "uint8",
                 "--classes", "10", "--out", str(out)]]
    if key == "gpt":  # the tiny GPT's demo corpus (tokens; sizes in docs/lm.md)
        return [[py, "-m", "hpcdp.data.prep.text.markov_recipe", "--out", str(out)]]
    if key.startswith("dlrm_"):
        rows = train_recsys.rows_needed(args.warmup + args.steps, batch, 2)
        return [train_recsys.prep_command(out, key.removeprefix("dlrm_"), rows)]
    if key == "gpt2_124m":
        return None
    raise ValueError(f"no data recipe for {key!r}")


def prepare_data(root: Path, chosen: Sequence[Setup], args: argparse.Namespace,
                 ) -> dict[str, Path]:
    """Each setup's data, written once for every run that reads it."""
    paths: dict[str, Path] = {}
    env = common.pythonpath_env()
    for s in chosen:
        if s.data in paths:
            continue
        out = root / s.data
        commands = prep_commands(s.data, out, args, s.batch)
        if commands is None:  # the GPT-2 shape's random tokens: written here
            windows = max(train_lm.windows_needed(args.warmup + args.steps, s.batch, 2), 1024)
            train_lm.write_corpus(out, windows)
        for cmd in commands or ():
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout,
                                  env=env)
            if done.returncode:
                raise common.BenchError(f"preparing {out} failed:\n{done.stdout}{done.stderr}")
        paths[s.data] = out
    return paths


def train_overrides(s: Setup, data: Path, run_dir: Path, args: argparse.Namespace) -> list[str]:
    """`hpcdp train` arguments: a fixed step count, windows of `window` steps, no extra
    output, then the setup's own overrides and the user's (--set)."""
    argv = ["--config", str(s.config)] if s.config else []
    argv += [f"data.path={data}", f"run.dir={run_dir}", f"model.name={s.model}",
             f"data.batch_size={s.batch}", f"run.max_steps={args.warmup + args.steps}",
             "run.epochs=100000", f"log.every_steps={args.window}", "log.tensorboard=false",
             "log.progress=false", "checkpoint.resume=none", "checkpoint.every_steps=0",
             "checkpoint.keep=1"]
    if s.model == "resnet18":
        argv += [f"image.width={args.width}", f"image.cifar_stem={str(args.cifar_stem).lower()}"]
    return argv + list(s.overrides) + list(args.set)
