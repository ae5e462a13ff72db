"""Named networks (hpcdp.models.named): model.name = torchvision:, timm:, transformers:, or a
builder of the user's; model.kwargs as a free table; the optional libraries' checks.

The library builds import torchvision, timm and transformers (seconds): they are
marked slow. They run on the real libraries of the `models` extra, including the
torchvision whose compiled operators do not load beside a CPU torch (the package
index's wheels are CUDA builds): its classification builders must still work.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from hpcdp import config as cfgmod
from hpcdp import doctor, tasks
from hpcdp.config import ConfigError
from hpcdp.data.format import tokens as tk
from hpcdp.models import libraries, named
from hpcdp.tasks import image, lm

LLAMA = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2,
         "num_attention_heads": 2, "num_key_value_heads": 2, "max_position_embeddings": 32}

BUILDER = '''\
import torch
from torch import nn


def make(cfg, sample_shape, hidden=8):
    c, h, w = sample_shape
    return nn.Sequential(nn.Flatten(), nn.Linear(c * h * w, hidden), nn.ReLU(),
                         nn.Linear(hidden, int(cfg.image.num_classes)))


def raises(cfg, sample_shape):
    raise RuntimeError("my builder broke")


def not_a_module(cfg, sample_shape):
    return "a string"


VALUE = 3
'''


def image_cfg(*overrides: str) -> cfgmod.Config:
    return cfgmod.build(None, ["data.path=/nonexistent", "image.num_classes=5", *overrides],
                        tasks.defaults)


@pytest.fixture
def builder_file(tmp_path: Path) -> Path:
    path = tmp_path / "mine" / "nets.py"
    path.parent.mkdir()
    path.write_text(BUILDER)
    return path


# -- the config: model.kwargs, model.name paths -------------------------------------------


def test_kwargs_is_a_free_table_written_back_as_toml(tmp_path: Path) -> None:
    (tmp_path / "run.toml").write_text(
        '[data]\npath = "/x"\n[model]\nname = "timm:vit_tiny_patch16_224"\n'
        '[model.kwargs]\nimg_size = 16\nwidths = [8, 16]\ninner = {a = 1.5, b = "x"}\n')
    cfg = cfgmod.build(tmp_path / "run.toml", [], tasks.defaults)
    assert cfg.model.kwargs == {"img_size": 16, "widths": [8, 16], "inner": {"a": 1.5, "b": "x"}}
    again = cfgmod.tomllib.loads(cfgmod.dumps(cfg))["model"]
    assert again["kwargs"] == cfg.model.kwargs
    # A recorded config (a checkpoint's) rebuilds the same table.
    assert cfgmod.from_record(cfg.to_dict(), "record").model.kwargs == cfg.model.kwargs


@pytest.mark.parametrize(("override", "message"), [
    ("model.kwargs=3", "model.kwargs: expected a table"),
    ("model.kwargs={a=inf}", "model.kwargs.a: expected a finite number"),
])
def test_kwargs_values_toml_cannot_write_back_are_refused(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        image_cfg("model.name=timm:resnet18", override)


@pytest.mark.parametrize("task", ["image", "lm"])
def test_kwargs_with_a_task_s_own_model_is_refused(task: str) -> None:
    with pytest.raises(ConfigError, match="model.kwargs is for a named network"):
        cfgmod.build(None, ["data.path=/x", f"task.name={task}", "model.kwargs={depth=2}"],
                     tasks.defaults)


def test_a_builder_file_is_recorded_absolute_from_the_config_s_folder(tmp_path: Path) -> None:
    (tmp_path / "run.toml").write_text('[data]\npath = "/x"\n[model]\nname = "sub/nets.py:make"\n')
    cfg = cfgmod.build(tmp_path / "run.toml", [], tasks.defaults)
    assert cfg.model.name == f"{tmp_path}/sub/nets.py:make"
    # An override is taken from the working folder; modules and libraries stay as written.
    over = cfgmod.build(tmp_path / "run.toml", ["model.name=other.py:make"], tasks.defaults)
    assert over.model.name == f"{Path.cwd()}/other.py:make"
    for name in ("torchvision:resnet18", "pkg.mod:make", "digits_cnn"):
        assert cfgmod.absolute_model(name, tmp_path) == name
    assert cfgmod.absolute_model("transformers:cfg/llama.json", tmp_path) == \
        f"transformers:{tmp_path}/cfg/llama.json"


@pytest.mark.parametrize(("task", "name", "ok"), [
    ("image", "torchvision:resnet18", True), ("image", "timm:vit_tiny_patch16_224", True),
    ("image", "os.path:join", True), ("image", "transformers:LlamaConfig", False),
    ("lm", "transformers:LlamaConfig", True), ("lm", "os.path:join", True),
    ("lm", "torchvision:resnet18", False), ("recsys", "timm:resnet18", False),
])
def test_each_task_names_the_kinds_of_network_it_builds(task: str, name: str, ok: bool) -> None:
    t = tasks.get(task)
    if ok:
        t.check_model(name)
    else:
        with pytest.raises(ConfigError, match=f"task {task!r} builds no"):
            t.check_model(name)


@pytest.mark.parametrize(("name", "kind"), [
    ("torchvision:resnet18", "torchvision"), ("timm:vit_tiny_patch16_224", "timm"),
    ("transformers:LlamaConfig", "transformers"), ("pkg.mod:make", "builder"),
    ("/abs/nets.py:make", "builder"), ("resnet18", None)])
def test_names_parse_into_their_kind(name: str, kind: str | None) -> None:
    assert named.kinds(name) == kind


@pytest.mark.parametrize("name", ["torchvision:", "pkg.mod:1x", "a b:make"])
def test_a_malformed_name_is_refused_naming_the_forms(name: str) -> None:
    with pytest.raises(named.ModelError, match="model.name="):
        named.parse(name)


# -- a user's builder ----------------------------------------------------------------------


def test_a_builder_gets_the_config_the_sample_shape_and_its_kwargs(builder_file: Path) -> None:
    cfg = image_cfg(f"model.name={builder_file}:make", "model.kwargs={hidden=7}")
    net = image.model(cfg, (1, 4, 4))
    assert net[1].out_features == 7 and net[3].out_features == 5  # image.num_classes
    assert net(torch.zeros(2, 1, 4, 4)).shape == (2, 5)


@pytest.mark.parametrize(("attr", "message"), [
    ("nosuch", "has no attribute 'nosuch'"),
    ("raises", "the builder raised RuntimeError: my builder broke"),
    ("not_a_module", "the builder returned a str, not a torch.nn.Module"),
    ("VALUE", "VALUE in file .* is a int, not a callable builder"),
])
def test_bad_builders_are_named(builder_file: Path, attr: str, message: str) -> None:
    cfg = image_cfg(f"model.name={builder_file}:{attr}")
    with pytest.raises(named.ModelError, match=message):
        image.model(cfg, (1, 4, 4))


def test_the_training_command_s_check_finds_a_builder_before_any_rank_starts() -> None:
    with pytest.raises(named.ModelError, match="module 'no_such_mod' cannot be imported"):
        tasks.get("image").check_model("no_such_mod:make")
    with pytest.raises(named.ModelError, match="has no attribute 'jion'.*'join'"):
        tasks.get("lm").check_model("os.path:jion")


def test_a_missing_module_or_file_is_named() -> None:
    with pytest.raises(named.ModelError, match="module 'no_such_mod' cannot be imported"):
        image.model(image_cfg("model.name=no_such_mod:make"), (1, 4, 4))
    with pytest.raises(named.ModelError, match="file /no/such.py does not exist"):
        image.model(image_cfg("model.name=/no/such.py:make"), (1, 4, 4))


def test_keywords_that_would_fetch_weights_are_refused(builder_file: Path) -> None:
    for key in ("weights", "pretrained", "checkpoint_path"):
        cfg = image_cfg(f"model.name={builder_file}:make", f"model.kwargs={{{key}=true}}")
        with pytest.raises(named.ModelError, match=f"model.kwargs.{key} .*never loads"):
            image.model(cfg, (1, 4, 4))


# -- the libraries ---------------------------------------------------------------------------


def test_importing_hpcdp_and_its_tasks_imports_no_model_library() -> None:
    code = ("import sys, hpcdp, hpcdp.config, hpcdp.tasks.image, hpcdp.tasks.lm, "
            "hpcdp.models.named; print([m for m in ('torchvision', 'timm', 'transformers') "
            "if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True)
    assert out.stdout.strip() == "[]"


def test_a_pin_on_another_torch_is_a_mismatch_naming_both(monkeypatch) -> None:
    monkeypatch.setattr(libraries, "torch_pin", lambda name: "2.99.0")
    monkeypatch.setattr(libraries, "version", lambda name: "0.99.0")
    said = libraries.mismatch("torchvision", "2.13.0+cpu")
    assert said and "built for torch 2.99.0" in said and "torch 2.13.0+cpu" in said
    monkeypatch.setattr(libraries, "torch_pin", lambda name: "2.13.0")
    assert libraries.mismatch("torchvision", "2.13.0+cpu") is None


def test_doctor_fails_a_mismatch_and_warns_of_missing_ops() -> None:
    rows = [{"name": "torchvision", "version": "0.1", "problem": "built for torch 9", "note": None},
            {"name": "timm", "version": None, "problem": None, "note": None},
            {"name": "transformers", "version": "5", "problem": None, "note": "ops missing"}]
    got = [(c.status, c.name) for c in doctor.model_library_checks(rows)]
    assert got == [(doctor.FAIL, "torchvision"), (doctor.OK, "timm"),
                   (doctor.WARN, "transformers")]


@pytest.mark.slow
def test_torchvision_and_timm_networks_build_offline_with_the_data_s_head() -> None:
    resnet = image.model(image_cfg("model.name=torchvision:resnet18"), (3, 16, 16))
    assert resnet(torch.zeros(2, 3, 16, 16)).shape == (2, 5)
    vit = image.model(image_cfg("model.name=timm:vit_tiny_patch16_224",
                                "model.kwargs={img_size=16, patch_size=4, depth=1}"), (1, 16, 16))
    assert vit(torch.zeros(2, 1, 16, 16)).shape == (2, 5)  # in_chans from the samples
    with pytest.raises(named.ModelError, match="has no classification network 'resnet19'.*"
                                               "did you mean 'resnet18'"):
        image.model(image_cfg("model.name=torchvision:resnet19"), (3, 16, 16))
    with pytest.raises(named.ModelError, match="timm .* has no network 'vit_tinny"):
        image.model(image_cfg("model.name=timm:vit_tinny"), (3, 16, 16))
    with pytest.raises(named.ModelError, match="model.kwargs.num_classes"):
        image.model(image_cfg("model.name=timm:resnet18", "model.kwargs={num_classes=3}"),
                    (3, 16, 16))
    # Whatever torchvision's compiled operators did, doctor's report names no failure here.
    assert all(row["problem"] is None for row in libraries.report())


def token_file(path: Path, vocab: int = 12) -> Path:
    meta = tk.TokenMeta(vocab, 0, "markov-test", "00" * 32)
    docs = [np.asarray([*range(1, vocab)] * 4 + [0], np.uint16) for _ in range(8)]
    tk.write_tokens(path, docs, meta)
    return path


def lm_cfg(folder: Path, *overrides: str) -> cfgmod.Config:
    return cfgmod.build(None, [f"data.path={folder}", "task.name=lm", "lm.seq_len=8",
                               *overrides], tasks.defaults)


@pytest.mark.slow
def test_a_llama_from_its_config_class_takes_the_token_file_s_vocabulary(tmp_path: Path) -> None:
    token_file(tmp_path / "train.h5")
    kwargs = "model.kwargs=" + json.dumps(LLAMA).replace('"', "").replace(":", "=")
    cfg = lm.from_data(lm_cfg(tmp_path, "model.name=transformers:LlamaConfig", kwargs),
                       tmp_path / "train.h5")
    assert cfg.lm.vocab_size == 12  # recorded: the rebuild reads no data file
    net = lm.model(cfg, (8,))
    out = net(torch.zeros(2, 8, dtype=torch.long))
    assert type(net).__name__ == "LlamaForCausalLM" and out.logits.shape == (2, 8, 12)
    assert lm.loss(out, torch.zeros(2, 8, dtype=torch.long)).ndim == 0
    too_small = lm_cfg(tmp_path, "model.name=transformers:LlamaConfig", kwargs,
                       "lm.vocab_size=5")
    with pytest.raises(ConfigError, match="lm.vocab_size=5, but .* token ids up to 11"):
        lm.from_data(too_small, tmp_path / "train.h5")
    with pytest.raises(named.ModelError, match="max_position_embeddings=4 is below"):
        named.causal_lm("transformers:LlamaConfig", {**LLAMA, "max_position_embeddings": 4},
                        12, 8)
    with pytest.raises(named.ModelError, match="no config class 'LamaConfig'.*LlamaConfig"):
        named.causal_lm("transformers:LamaConfig", {}, 12, 8)


@pytest.mark.slow
def test_a_config_json_is_folded_into_the_recorded_config(tmp_path: Path) -> None:
    token_file(tmp_path / "train.h5")
    (tmp_path / "llama.json").write_text(json.dumps(
        {"model_type": "llama", **LLAMA, "vocab_size": 32000, "rope_scaling": None,
         "hidden_act": "silu"}))
    (tmp_path / "run.toml").write_text(
        f'[task]\nname = "lm"\n[data]\npath = "{tmp_path}"\n[model]\n'
        'name = "transformers:llama.json"\n[model.kwargs]\nnum_hidden_layers = 1\n'
        '[lm]\nseq_len = 8\n')
    cfg = cfgmod.build(tmp_path / "run.toml", [], tasks.defaults)
    assert cfg.model.name == f"transformers:{tmp_path}/llama.json"
    filled = lm.from_data(cfg, tmp_path / "train.h5")
    assert filled.model.name == "transformers:LlamaConfig"
    kwargs = filled.model.kwargs
    assert kwargs["num_hidden_layers"] == 1 and kwargs["hidden_size"] == 16  # kwargs win
    assert "vocab_size" not in kwargs and "rope_scaling" not in kwargs  # the data's; null
    (tmp_path / "llama.json").unlink()  # the recorded config needs the file no more
    again = cfgmod.from_record(filled.to_dict(), "record")
    net = lm.model(again, (8,))
    assert net.config.vocab_size == 12 and net.config.num_hidden_layers == 1


class NextId(torch.nn.Module):
    """A causal LM stand-in whose output has `.logits`: the next id is the last one + 1."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.vocab, self.seen = vocab, []
        self.scale = torch.nn.Parameter(torch.ones(()))

    def forward(self, ids: torch.Tensor):
        from types import SimpleNamespace

        self.seen.append(ids.shape[1])
        logits = torch.nn.functional.one_hot((ids + 1) % self.vocab, self.vocab).float()
        return SimpleNamespace(logits=logits * self.scale * 10)


def test_generate_samples_any_causal_lm_over_its_window() -> None:
    from hpcdp.export.sample import generate

    net = NextId(7)
    got = generate(net, [3], 10, temperature=0, window=4)
    assert got.ids == [4, 5, 6, 0, 1, 2, 3, 4, 5, 6]
    assert max(net.seen) == 4 and got.slid_at == 4  # never more than the window
    with pytest.raises(ValueError, match="window of tokens"):
        generate(NextId(7), [3], 2)
