"""The lm task's pieces without MPI: config, metrics, rates, clipping, readers' checks."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from hpcdp import config as cfgmod
from hpcdp import tasks
from hpcdp.config import ConfigError
from hpcdp.data.format import tokens as tk
from hpcdp.data.prep.text import markov as mk
from hpcdp.data.read.tokens import TokenReaderError
from hpcdp.models import gpt
from hpcdp.tasks import lm
from hpcdp.train.evaluate import MetricSums
from hpcdp.train.step import clip


def build(*overrides: str) -> cfgmod.Config:
    return cfgmod.build(None, ["task.name=lm", "data.path=data/x", *overrides],
                        task_defaults=tasks.defaults)


def test_lm_defaults_are_adamw_with_clipping_and_decay_groups() -> None:
    cfg = build()
    assert (cfg.model.name, cfg.optim.name, cfg.optim.betas) == ("gpt", "adamw", [0.9, 0.95])
    assert cfg.optim.grad_clip == 1.0 and cfg.optim.weight_decay == 0.1
    net = gpt.GPT(lm.gpt_config(cfg, 17))
    (opt,) = lm.TASK.optimizers(cfg, net)
    assert isinstance(opt, torch.optim.AdamW) and opt.defaults["betas"] == (0.9, 0.95)
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]
    decayed = {id(p) for p in opt.param_groups[0]["params"]}
    # The tied token matrix multiplies (the output layer): decayed; positions are not.
    assert id(net.tok_emb.weight) in decayed and id(net.pos_emb.weight) not in decayed
    assert sum(len(g["params"]) for g in opt.param_groups) == len(list(net.parameters()))


@pytest.mark.parametrize("override, needle", [
    ("optim.betas=[0.9]", "optim.betas"),
    ("lm.heads=3", "not a multiple of lm.heads=3"),
    ("lm.tokenizer_sha256=abc", "64 lower-case hex digits"),
    ("optim.grad_clip=-1", "optim.grad_clip=-1"),
    ("lm.seq_len=0", "lm.seq_len=0"),
])
def test_bad_lm_config_is_refused(override: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        build(override)


def test_clipping_cannot_combine_with_adasum() -> None:
    with pytest.raises(ConfigError, match="grad_clip cannot be combined"):
        build("horovod.op=adasum")
    assert build("horovod.op=adasum", "optim.grad_clip=0").horovod.op == "adasum"


def test_perplexity_is_exp_of_the_loss_reduced_over_all_tokens() -> None:
    # Two "ranks": 10 tokens at mean loss 1.0 and 30 at 2.0; one set of sums as reduced.
    sums = MetricSums(lm.TASK.metrics, torch.device("cpu"))
    for mean, tokens in ((1.0, 10), (2.0, 30)):
        targets = torch.zeros(1, tokens, dtype=torch.long)
        sums.add(lm.measure(None, targets, torch.tensor(mean)), lm.count(targets))
    (loss_sum,), tokens = sums.sums.tolist(), sums.count  # what reduce() divides after its sum
    values = {"loss": loss_sum / tokens}
    assert values["loss"] == pytest.approx(1.75)
    ppl = lm.derive(values)["perplexity"]
    assert ppl == pytest.approx(math.exp(1.75))
    assert ppl != pytest.approx((math.exp(1.0) + math.exp(2.0)) / 2)  # not a mean of exps
    assert lm.derive({}) == {}


def test_rates_give_tokens_per_s_and_mfu_only_with_a_peak() -> None:
    cfg = build("lm.seq_len=32")
    net = gpt.GPT(lm.gpt_config(cfg, 17))
    cpu = torch.device("cpu")
    assert lm.rates(cfg, net, 100.0, 1, cpu) == {"tokens_per_s": 3200.0}
    cfg = build("lm.seq_len=32", "lm.peak_tflops=1")
    flops = gpt.flops_per_token(net.cfg, gpt.num_params(net, embeddings=False))
    got = lm.rates(cfg, net, 100.0, 1, cpu)
    assert got["mfu"] == pytest.approx(3200.0 * flops / 1e12)
    assert lm.rates(cfg, net, 200.0, 2, cpu)["mfu"] == pytest.approx(got["mfu"])  # per device


def test_clip_scales_the_global_norm_and_returns_it_before() -> None:
    net = torch.nn.Linear(3, 2)
    for p in net.parameters():
        p.grad = torch.full_like(p, 2.0)  # 8 values: global norm 2 * sqrt(8)
    run = SimpleNamespace(scaler=None, optimizers=[], model=net)
    norm = clip(run, 1.0)  # type: ignore[arg-type]
    assert float(norm) == pytest.approx(2 * math.sqrt(8))
    after = torch.cat([p.grad.flatten() for p in net.parameters()]).norm()
    assert float(after) == pytest.approx(1.0, rel=1e-5)
    assert float(clip(run, 10.0)) == pytest.approx(1.0, rel=1e-5)  # below: untouched
    assert float(torch.cat([p.grad.flatten() for p in net.parameters()]).norm()) == (
        pytest.approx(1.0, rel=1e-5))


def write(path: Path, docs: int = 60) -> None:
    chain = mk.random_chain(8, 2, 0.2, seed=1)
    meta = tk.TokenMeta(chain.vocab_size, chain.eod, "markov", "00" * 32)
    tk.write_tokens(path, mk.sample_documents(chain, 0, 0, 0, docs), meta)


@pytest.mark.parametrize("override, needle", [
    ("lm.tokenizer_sha256=" + "ab" * 32, "the given tokenizer has sha256"),
    ("lm.seq_len=100000", "is longer than the data"),
    ("data.batch_size=100000", "fewer than one global batch of 100000"),
])
def test_readers_name_bad_input(tmp_path: Path, override: str, needle: str) -> None:
    write(tmp_path / "train.h5")
    write(tmp_path / "val.h5", 20)
    cfg = build(f"data.path={tmp_path}", override)
    with pytest.raises(TokenReaderError, match=needle):
        lm.readers(cfg, 0, 1, cfg.data.batch_size, torch.device("cpu"))


def test_validation_scores_every_window_once(tmp_path: Path) -> None:
    write(tmp_path / "train.h5")
    write(tmp_path / "val.h5", 20)
    cfg = build(f"data.path={tmp_path}", "lm.seq_len=8", "data.batch_size=4",
                "data.val_batch_size=3")
    windows = tk.validate_tokens(tmp_path / "val.h5").windows(8)
    seen = 0
    for rank in range(3):
        _, val = lm.readers(cfg, rank, 3, 4, torch.device("cpu"))
        for _ in range(2):  # iterable afresh for each validation
            batches = list(val)
            assert all(len(x) <= 3 and x.shape == y.shape for x, y in batches)
        seen += sum(len(x) for x, _ in batches)
        val.close()
    assert seen == windows
