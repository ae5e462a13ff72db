"""The GPT language-model task in the shared trainer, on 1 and 2 ranks under mpirun.

A tiny Markov corpus (written here with plain token files) and a tiny GPT keep
each run to a few seconds; every run is time-bounded by the `ranks` fixture.
"""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

import h5py
import pytest
import torch

from hpcdp.data.format import tokens as tk
from hpcdp.data.prep.text import markov as mk
from hpcdp.train import checkpoint_folder as ckfolder
from hpcdp.train import checkpoint_format as ckformat

pytestmark = pytest.mark.parallel

TRAIN = [sys.executable, "-m", "hpcdp.train"]
BOUND = 120.0
SEQ = 16


def write_split(path: Path, chain: mk.MarkovChain, split: int, docs: int) -> int:
    meta = tk.TokenMeta(chain.vocab_size, chain.eod, "markov", "00" * 32)
    tk.write_tokens(path, mk.sample_documents(chain, 0, split, 0, docs), meta)
    return tk.validate_tokens(path).windows(SEQ)


@pytest.fixture
def corpus(tmp_path: Path) -> tuple[Path, int]:
    """train.h5 and val.h5 of a 16-symbol chain; returns (folder, training windows)."""
    d = tmp_path / "data"
    d.mkdir()
    chain = mk.random_chain(16, 2, 0.1, seed=3)
    windows = write_split(d / "train.h5", chain, 0, 200)
    write_split(d / "val.h5", chain, 1, 40)
    return d, windows


def final_state(run: Path) -> dict:
    found = ckfolder.find_latest(run / "checkpoints")
    assert found is not None, f"no checkpoint in {run}"
    return ckformat.decode(found.data, str(found.path))


def assert_same_params(a: dict, b: dict, exact: bool, atol: float = 0.0) -> None:
    assert a["model"].keys() == b["model"].keys()
    for k in a["model"]:
        if exact:
            assert torch.equal(a["model"][k], b["model"][k]), k
        else:
            torch.testing.assert_close(a["model"][k], b["model"][k], atol=atol, rtol=1e-4)


def failing(ranks, argv: list[str]) -> str:
    run = ranks(argv, np=2, timeout=60.0, expect_ok=False)
    assert not run.timed_out and run.returncode != 0, run.describe()
    return run.output


# Each rank's text, split at mpirun's --tag-output prefixes (two ranks may share a line).
_TAGGED = re.compile(r"\[\d+,(\d+)\]<std(?:out|err)>:((?:(?!\[\d+,\d+\]<std).)*)", re.S)


def on_every_rank(output: str, needle: str) -> None:
    ranks_saying = {int(rank) for rank, text in _TAGGED.findall(output) if needle in text}
    assert ranks_saying >= {0, 1}, output


RUN_SETTINGS = (  # after the args fixture's SMALL_RUN; a later value of a key wins
    "task.name=lm", f"lm.seq_len={SEQ}", "lm.layers=1", "lm.heads=2", "lm.width=16",
    "data.batch_size=8", "data.val_batch_size=8", "log.every_steps=4",
    "checkpoint.every_steps=0", "run.epochs=2", "data.virtual_shards=8",
)


def test_two_ranks_equal_one_rank_with_twice_the_batch(args, ranks, corpus, tmp_path: Path) -> None:
    """With clipping that binds: the clip must act on the averaged gradients to match."""
    data, windows = corpus
    common = ("optim.grad_clip=0.05", "run.epochs=1", "schedule.warmup_epochs=0.2")
    two, one = tmp_path / "two", tmp_path / "one"
    one_thread = {"OMP_NUM_THREADS": "1"}  # a CPU kernel's sums follow its thread count
    out = ranks(TRAIN, *args(data, two, *common, "data.batch_size=8"), np=2, timeout=BOUND,
                env=one_thread)
    ranks(TRAIN, *args(data, one, *common, "data.batch_size=16"), np=1, timeout=BOUND)
    a, b = final_state(two), final_state(one)
    assert a["step"] == b["step"] == windows // 16
    assert_same_params(a, b, exact=False, atol=1e-5)
    assert "tokens/s" in out.output
    # The same 16 windows as two micro-batches of the 2 ranks' rows: the same bits.
    micro = tmp_path / "micro"
    ranks(TRAIN, *args(data, micro, *common, "data.batch_size=8",
                       "horovod.backward_passes_per_step=2"), np=1, timeout=BOUND, env=one_thread)
    assert_same_params(a, final_state(micro), exact=True)
    # Control: without clipping the same runs take other steps, so the clip binds here.
    free = tmp_path / "free"
    ranks(TRAIN, *args(data, free, "run.epochs=1", "schedule.warmup_epochs=0.2",
                       "optim.grad_clip=0", "data.batch_size=16"), np=1, timeout=BOUND)
    c = final_state(free)
    assert any(not torch.allclose(b["model"][k], c["model"][k], atol=1e-3) for k in b["model"])


def test_stopped_and_resumed_run_is_bitwise_identical(args, ranks, corpus, tmp_path: Path) -> None:
    data, windows = corpus
    full, cut = tmp_path / "full", tmp_path / "cut"
    ranks(TRAIN, *args(data, full), np=2, timeout=BOUND)
    steps = 2 * (windows // 16)
    stop = steps // 2 + 1  # mid-epoch, in the second epoch
    ranks(TRAIN, *args(data, cut, f"run.stop_at_step={stop}"), np=2, timeout=BOUND)
    assert not (cut / "summary.json").exists()
    second = ranks(TRAIN, *args(data, cut), np=2, timeout=BOUND)
    assert "resumed from" in second.output
    a, b = final_state(full), final_state(cut)
    assert a["step"] == b["step"] == steps
    assert_same_params(a, b, exact=True)
    for k, v in a["optimizers"][0]["state"].items():
        assert torch.equal(v["exp_avg_sq"], b["optimizers"][0]["state"][k]["exp_avg_sq"])

    summary = json.loads((full / "summary.json").read_text())
    assert summary["task"] == "lm"
    assert 0 < summary["val_loss"] < math.log(17)  # below the uniform guess over 17 ids
    assert summary["val_perplexity"] == pytest.approx(math.exp(summary["val_loss"]))
    assert summary["tokens_per_s"] == pytest.approx(summary["samples_per_s"] * SEQ)
    assert "mfu" not in summary  # a CPU with no configured peak
    train = [json.loads(line) for line in (full / "metrics.jsonl").read_text().splitlines()]
    logged = [r for r in train if "perplexity" in r and "tokens_per_s" in r]
    assert logged and all(r["perplexity"] == pytest.approx(math.exp(r["loss"])) for r in logged)


def poison_token(path: Path, vocab: int) -> None:
    """One id equal to the vocabulary size, in the data and in the recorded maximum."""
    with h5py.File(path, "r+") as f:
        f["tokens"][3] = vocab
        f.attrs["max_token_id"] = vocab


@pytest.mark.parametrize("case", ["token_id", "tokenizer", "too_long", "too_few"])
def test_bad_input_is_named_on_every_rank(args, ranks, corpus, tmp_path: Path, case: str) -> None:
    data, windows = corpus
    extra: list[str] = []
    if case == "token_id":
        poison_token(data / "train.h5", 17)
        needle = "is not below the vocabulary size 17"
    elif case == "tokenizer":
        extra = ["lm.tokenizer_sha256=" + "ab" * 32]
        needle = "but the given tokenizer has sha256 abababab"
    elif case == "too_long":
        extra = ["lm.seq_len=100000"]
        needle = "sequence length 100000 is longer than the data"
    else:
        extra = [f"data.global_batch_size={2 * windows}"]
        needle = f"fewer than one global batch of {2 * windows}"
    run = tmp_path / "r"
    out = failing(ranks, [*TRAIN, *args(data, run, *extra)])
    on_every_rank(out, needle)
    assert not (run / "checkpoints").exists()
