"""BatchNorm convnets on 2 ranks: one set of running statistics (hpcdp.train.norm_stats).

A run stopped and resumed (mid-epoch and at an epoch boundary, augmentation on)
ends bitwise where the uninterrupted run ends, and `hpcdp eval` of the final
checkpoint on 1 and on 2 ranks gives the run's own validation numbers (one test
per model, so the uninterrupted run serves both checks). Tiny
widths and 8x8 images keep each launch to a few seconds; every launch is bounded
by the `ranks` fixture.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from hpcdp.train import checkpoint_folder as ckfolder
from hpcdp.train import checkpoint_format as ckformat

pytestmark = pytest.mark.parallel

N_TRAIN, N_VAL = 192, 51  # 6 steps per epoch at 16 x 2; uneven validation shares (25, 26)
TRAIN = [sys.executable, "-m", "hpcdp.train"]
EVAL = [sys.executable, "-m", "hpcdp.cli", "eval"]
BOUND = 120.0
STEPS = 2 * N_TRAIN // 32
STOPS = (4, 6)  # mid-epoch, then the end of epoch 0 (before its validation)

RUN_SETTINGS = ("run.epochs=2", "optim.lr=0.05", "optim.momentum=0.9", "log.every_steps=3",
                "checkpoint.every_steps=0", "image.num_classes=4", "image.augment=crop_flip",
                "image.crop_padding=2")
MODELS = {
    "small_cnn": ("model.name=small_cnn", "image.width=4"),
    "resnet18": ("model.name=resnet18", "image.width=2", "image.cifar_stem=true"),
}


def final_state(run: Path) -> dict:
    found = ckfolder.find_latest(run / "checkpoints")
    assert found is not None, f"no checkpoint in {run}"
    return ckformat.decode(found.data, str(found.path))


def metrics(run: Path, kind: str) -> list[tuple]:
    """(step, loss, acc) of each `kind` record in metrics.jsonl (timings differ by run)."""
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [(r["step"], r["loss"], r["acc"]) for r in map(json.loads, lines) if r["kind"] == kind]


@pytest.mark.parametrize("model", list(MODELS))
def test_resumed_run_ends_bitwise_as_the_uninterrupted_one_and_eval_agrees(
        args, ranks, data: Path, tmp_path: Path, model: str) -> None:
    full, cut = tmp_path / "full", tmp_path / "cut"
    ranks(TRAIN, *args(data, full, *MODELS[model]), np=2, timeout=BOUND)
    for stop in STOPS:
        out = ranks(TRAIN, *args(data, cut, *MODELS[model], f"run.stop_at_step={stop}"), np=2,
                    timeout=BOUND).output
        assert f"stopped at step {stop}" in out
    ranks(TRAIN, *args(data, cut, *MODELS[model]), np=2, timeout=BOUND)
    a, b = final_state(full), final_state(cut)
    assert a["step"] == b["step"] == STEPS
    assert a["model"].keys() == b["model"].keys()
    assert any("running_mean" in k for k in a["model"])
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    summary = json.loads((full / "summary.json").read_text())
    resumed = json.loads((cut / "summary.json").read_text())
    assert (resumed["val_loss"], resumed["val_acc"]) == (summary["val_loss"], summary["val_acc"])
    assert metrics(cut, "val") == metrics(full, "val")
    # Training windows cut by a stop carry on from the checkpoint's metric sums.
    assert metrics(cut, "train") == metrics(full, "train")
    assert [step for step, *_ in metrics(full, "train")] == [3, 6, 9, 12]
    # The final checkpoint scored by `hpcdp eval` on 1 and on 2 ranks: the run's numbers.
    for np_ in (1, 2):
        target = tmp_path / f"eval{np_}.json"
        ranks(EVAL, "--run", str(full), "--out", str(target), np=np_, timeout=BOUND)
        result = json.loads(target.read_text())
        assert result["world_size"] == np_ and result["samples"] == N_VAL
        assert result["acc"] == summary["val_acc"], np_
        # One rank cuts the batches elsewhere: float32 batch means round differently.
        rel = 1e-12 if np_ == 2 else 1e-6
        assert result["loss"] == pytest.approx(summary["val_loss"], rel=rel, abs=0), np_
