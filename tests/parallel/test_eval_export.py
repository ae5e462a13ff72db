"""After training: `hpcdp eval` on 1 and 2 ranks gives the run's final validation numbers;
the exported model scores the validation file as the run did.

Each task's tiny run is trained once on 2 ranks under mpirun (the image run shared by
the two image tests), then its checkpoint is evaluated under mpirun with 1 and 2 ranks;
every run is bounded by the `ranks` fixture.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from hpcdp.data.format import tokens as tk
from hpcdp.data.prep.text import markov as mk
from hpcdp.export import load
from hpcdp.export.command import export

pytestmark = pytest.mark.parallel

TRAIN = [sys.executable, "-m", "hpcdp.train"]
EVAL = [sys.executable, "-m", "hpcdp.cli", "eval"]
BOUND = 120.0


def same_numbers(summary: dict, result: dict, names: list[str]) -> None:
    """Equal on the run's world size; on another, up to the float32 rounding of batch means
    (the ranks' shares cut the batches elsewhere)."""
    assert result["samples"] == summary["val_samples"]
    rel = 1e-12 if result["world_size"] == summary["world_size"] else 1e-6
    for name in names:
        assert result[name] == pytest.approx(summary[f"val_{name}"], rel=rel, abs=0), name


def evaluate_twice(ranks, run: Path, tmp_path: Path, *extra: str) -> list[dict]:
    """eval.json of the run's checkpoint on 1 rank and on 2 ranks."""
    out = []
    for np_ in (1, 2):
        target = tmp_path / f"eval{np_}.json"
        ranks(EVAL, "--run", str(run), "--out", str(target), *extra, np=np_, timeout=BOUND)
        result = json.loads(target.read_text())
        assert result["world_size"] == np_
        out.append(result)
    return out


N_TRAIN, N_VAL = 480, 96  # module_data's image files


@pytest.fixture(scope="module")
def image_run(module_ranks, module_data: Path, tmp_path_factory) -> Path:
    """One image run trained on 2 ranks, evaluated and exported by the tests below."""
    run = tmp_path_factory.mktemp("image") / "run"
    module_ranks(TRAIN, f"data.path={module_data}", f"run.dir={run}", "data.batch_size=16",
                 "data.val_batch_size=16", "log.tensorboard=false", "run.epochs=2",
                 np=2, timeout=BOUND)
    return run


def test_image_eval_and_export_reproduce_the_run(ranks, image_run: Path, module_data: Path,
                                                 tmp_path: Path) -> None:
    data, run = module_data, image_run
    summary = json.loads((run / "summary.json").read_text())
    for result in evaluate_twice(ranks, run, tmp_path):
        same_numbers(summary, result, ["loss", "acc"])
    # The exported model, fed as config.json says, scores the validation file as the run did.
    export(run, tmp_path / "exp")
    net, config = load(tmp_path / "exp")
    with h5py.File(data / "val.h5", "r") as f:
        x, y = torch.from_numpy(f["x"][:]), torch.from_numpy(f["y"][:])
    schema = config["input"]
    x = (x.float() / schema["scale"] - schema["mean"]) / schema["std"]
    with torch.no_grad():
        acc = (net(x).argmax(1) == y).double().mean().item()
    assert acc == summary["val_acc"]


def test_eval_of_another_file_and_a_file_that_does_not_fit(ranks, image_run: Path,
                                                           module_data: Path,
                                                           tmp_path: Path) -> None:
    data, run = module_data, image_run
    out = tmp_path / "train_eval.json"
    ranks(EVAL, "--run", str(run), "--file", str(data / "train.h5"), "--out", str(out), np=2,
          timeout=BOUND)
    assert json.loads(out.read_text())["samples"] == N_TRAIN
    wide = tmp_path / "wide.h5"
    with h5py.File(wide, "w") as f:
        f["x"] = np.zeros((8, 3, 8, 8), np.uint8)
        f["y"] = np.zeros(8, np.int64)
    bad = ranks(EVAL, "--run", str(run), "--file", str(wide), np=2, timeout=BOUND,
                expect_ok=False)
    assert not bad.timed_out and bad.returncode != 0
    assert bad.output.count("the model takes 1 channels") >= 2, bad.output  # every rank
    labelled = tmp_path / "labelled.h5"  # the run's model has 4 outputs (labels 0..3)
    with h5py.File(labelled, "w") as f:
        f["x"] = np.zeros((8, 1, 8, 8), np.uint8)
        f["y"] = np.arange(8, dtype=np.int64)
    # The model's outputs bound the labels, not a count the config is given.
    bad = ranks(EVAL, "--run", str(run), "--file", str(labelled), "image.num_classes=9", np=2,
                timeout=BOUND, expect_ok=False)
    assert not bad.timed_out and bad.returncode != 0
    assert bad.output.count("its largest label is 7, past image.num_classes = 4") >= 2, \
        bad.output


def write_tokens(path: Path, chain: mk.MarkovChain, split: int, docs: int) -> None:
    meta = tk.TokenMeta(chain.vocab_size, chain.eod, "markov-16", "00" * 32)
    tk.write_tokens(path, mk.sample_documents(chain, 0, split, 0, docs), meta)


def test_lm_eval_reproduces_the_run(ranks, tmp_path: Path) -> None:
    data, run = tmp_path / "tokens", tmp_path / "run"
    data.mkdir()
    chain = mk.random_chain(16, 2, 0.1, seed=3)
    write_tokens(data / "train.h5", chain, 0, 200)
    write_tokens(data / "val.h5", chain, 1, 40)
    ranks(TRAIN, "task.name=lm", f"data.path={data}", f"run.dir={run}", "lm.seq_len=16",
          "lm.layers=1", "lm.heads=2", "lm.width=16", "data.batch_size=8",
          "data.val_batch_size=8", "log.tensorboard=false", "run.epochs=1", np=2, timeout=BOUND)
    summary = json.loads((run / "summary.json").read_text())
    for result in evaluate_twice(ranks, run, tmp_path):
        same_numbers(summary, result, ["loss", "perplexity"])


def write_clicks(path: Path, n: int, seed: int) -> None:
    sizes = (20, 12, 6)
    rng = np.random.default_rng(seed)
    ids = np.stack([rng.integers(0, s, n) for s in sizes], 1).astype(np.int32)
    dense = rng.normal(size=(n, 4)).astype(np.float32)
    label = (rng.random(n) < 1 / (1 + np.exp(-(2.0 * (ids[:, 1] < 5) - 1.0)))).astype(np.uint8)
    with h5py.File(path, "w") as f:
        f.create_dataset("dense", data=dense, chunks=(32, 4))
        f.create_dataset("sparse", data=ids, chunks=(32, 3))
        f.create_dataset("label", data=label, chunks=(32,))
        f.attrs["table_sizes"] = np.asarray(sizes, np.int64)


def test_recsys_eval_reproduces_the_run(ranks, tmp_path: Path) -> None:
    data, run = tmp_path / "clicks", tmp_path / "run"
    data.mkdir()
    write_clicks(data / "train.h5", 512, 1)
    write_clicks(data / "val.h5", 128, 2)
    ranks(TRAIN, "task.name=recsys", f"data.path={data}", f"run.dir={run}",
          "data.batch_size=32", "data.val_batch_size=32", "recsys.embed_dim=4",
          "recsys.bottom=[8]", "recsys.top=[8]", "log.tensorboard=false", "run.epochs=1",
          np=2, timeout=BOUND)
    summary = json.loads((run / "summary.json").read_text())
    for result in evaluate_twice(ranks, run, tmp_path):
        same_numbers(summary, result, ["logloss", "auc"])
