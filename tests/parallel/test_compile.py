"""torch.compile in the trainer (run.compile) on 2 ranks: the same loss curve as eager,
checkpoints that cross between compiled and eager runs, both gradient paths.

Compiling is slow on two shared cores, so each test compiles once: a tiny GPT run
(flat gradient buckets) that resumes an eager checkpoint and is resumed by an eager
run; a tiny GPT run through Horovod's DistributedOptimizer; the digits CNN, whose
compiled gradients PyTorch gets wrong on CPUs (a strict xfail: it says when fixed).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from hpcdp.data.format import tokens as tk
from hpcdp.data.prep.text import markov as mk
from hpcdp.train import accel
from hpcdp.train import checkpoint_folder as ckfolder
from hpcdp.train import checkpoint_format as ckformat

# Each compiled run spends minutes compiling on two loaded cores: a bound well above it
pytestmark = [pytest.mark.parallel, pytest.mark.timeout(1500)]

TRAIN = [sys.executable, "-m", "hpcdp.train"]
BOUND = 600.0  # compiling takes most of it
STEPS = 12


def losses(run: Path) -> dict[int, float]:
    """{step: training loss} from every window of the run's metrics (one step each)."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if r["kind"] == "train"}


def final_model(run: Path) -> dict[str, torch.Tensor]:
    found = ckfolder.find_latest(run / "checkpoints")
    assert found is not None, f"no checkpoint in {run}"
    return ckformat.decode(found.data, str(found.path))["model"]


def assert_close_curves(a: dict[int, float], b: dict[int, float], steps: range) -> None:
    for s in steps:
        assert a[s] == pytest.approx(b[s], rel=1e-3, abs=1e-4), (s, a[s], b[s])


def digits_args(data: Path, run: Path, *extra: str) -> list[str]:
    return [f"data.path={data}", f"run.dir={run}", "data.batch_size=16",
            "data.val_batch_size=16", "optim.lr=0.05", "log.every_steps=1",
            "log.tensorboard=false", "checkpoint.every_steps=0", "run.epochs=2",
            # 10 outputs for the 4-class data, as the digits CNN had before the count came
            # from the file: the eager curve then falls fast enough to tell the two apart.
            "run.max_steps=6", "image.num_classes=10", *extra]


@pytest.mark.extended  # two runs, one compiling, for a PyTorch bug: CI's second tier
@pytest.mark.xfail(strict=True, reason=(
    "PyTorch 2.13's inductor on CPU gives the digits CNN's convolutions zero gradients "
    "(reproduced with torch.compile alone, without hpcdp; docs/gpu.md)"))
def test_compiled_digits_follows_eager_curve(ranks, make_data, tmp_path: Path) -> None:
    data = make_data(480, 32)
    eager, compiled = tmp_path / "eager", tmp_path / "compiled"
    ranks(TRAIN, *digits_args(data, eager), np=2, timeout=BOUND)
    ranks(TRAIN, *digits_args(data, compiled, "run.compile=true"), np=2, timeout=BOUND)
    assert_close_curves(losses(eager), losses(compiled), range(1, 7))


def write_tokens(path: Path, chain: mk.MarkovChain, split: int, docs: int) -> None:
    meta = tk.TokenMeta(chain.vocab_size, chain.eod, "markov", "00" * 32)
    tk.write_tokens(path, mk.sample_documents(chain, 0, split, 0, docs), meta)


@pytest.fixture(scope="module")
def tokens(tmp_path_factory) -> Path:
    data = tmp_path_factory.mktemp("data")
    chain = mk.random_chain(16, 2, 0.1, seed=3)
    write_tokens(data / "train.h5", chain, 0, 200)
    write_tokens(data / "val.h5", chain, 1, 10)
    return data


def gpt_args(data: Path, run: Path, *extra: str) -> list[str]:
    return ["task.name=lm", f"data.path={data}", f"run.dir={run}", "lm.seq_len=16",
            "lm.layers=1", "lm.heads=2", "lm.width=16", "data.batch_size=8",
            "data.val_batch_size=8", "log.every_steps=1", "log.tensorboard=false",
            f"run.max_steps={STEPS}", "run.epochs=2", "data.virtual_shards=8",
            "checkpoint.every_steps=4", *extra]


@pytest.fixture(scope="module")
def eager(module_ranks, tokens: Path, tmp_path_factory) -> Path:
    """One eager run of STEPS steps (flat gradient buckets), the reference of both compiled
    paths: eager runs through the buckets and through Horovod's DistributedOptimizer
    (horovod.bucket_mb=0) give the same bits (test_horovod.py checks the two paths agree)."""
    run = tmp_path_factory.mktemp("eager") / "run"
    module_ranks(TRAIN, *gpt_args(tokens, run), np=2, timeout=BOUND)
    return run


def test_compiled_gpt_resumes_eager_and_back(ranks, tokens: Path, eager: Path,
                                             tmp_path: Path) -> None:
    """Eager 0-4, compiled 4-8, eager 8-12 in one folder (flat gradient buckets): the loss
    of every step and the final weights match one eager run of 12 steps."""
    full, mixed = eager, tmp_path / "mixed"
    ranks(TRAIN, *gpt_args(tokens, mixed, "run.max_steps=4"), np=2, timeout=BOUND)
    second = ranks(TRAIN, *gpt_args(tokens, mixed, "run.max_steps=8", "run.compile=true"),
                   np=2, timeout=BOUND)
    assert "resumed from" in second.output
    keys = final_model(mixed).keys()  # the compiled run's step-8 checkpoint: no prefixes
    assert keys == final_model(full).keys()
    assert not [k for k in keys if accel.COMPILE_PREFIX in k]
    third = ranks(TRAIN, *gpt_args(tokens, mixed), np=2, timeout=BOUND)
    assert "resumed from" in third.output
    assert_close_curves(losses(full), losses(mixed), range(1, STEPS + 1))
    a, b = final_model(full), final_model(mixed)
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-4, rtol=1e-3)


def test_compiled_gpt_follows_eager_curve(ranks, tokens: Path, eager: Path,
                                          tmp_path: Path) -> None:
    """Tiny GPT through Horovod's DistributedOptimizer (horovod.bucket_mb=0)."""
    compiled = tmp_path / "compiled"
    ranks(TRAIN, *gpt_args(tokens, compiled, "horovod.bucket_mb=0", "run.compile=true"),
          np=2, timeout=BOUND)
    assert_close_curves(losses(eager), losses(compiled), range(1, STEPS + 1))
    a, b = final_model(eager), final_model(compiled)
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-4, rtol=1e-3)
