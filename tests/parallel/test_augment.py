"""Augmentation keyed by (seed, epoch, sample): the same on 1 and 2 ranks; exact resume."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from hpcdp.train import checkpoint_folder as ckfolder
from hpcdp.train import checkpoint_format as ckformat

pytestmark = pytest.mark.parallel

TRAIN = [sys.executable, "-m", "hpcdp.train"]
N_TRAIN, N_VAL = 480, 96
BOUND = 150.0


KINDS = ("crop_flip", "resized_crop_flip")


@pytest.fixture(scope="module")
def augmented(module_ranks, module_data: Path, tmp_path_factory) -> dict[int, Path]:
    """{ranks: folder}: every kind's augmented samples on 1 and on 2 ranks (one launch each,
    all kinds in it)."""
    out = {}
    for np_ in (1, 2):
        out[np_] = tmp_path_factory.mktemp(f"np{np_}")
        module_ranks("augment_batches", str(module_data / "train.h5"), str(out[np_]), "32",
                     ",".join(KINDS), np=np_, timeout=BOUND)
    return out


@pytest.mark.parametrize("kind", KINDS)
def test_a_sample_gets_the_same_augmentation_on_one_and_two_ranks(augmented, kind: str) -> None:
    got = {}
    for np_, folder in augmented.items():
        merged = {}
        parts = list((folder / kind).glob("rank-*.pt"))
        assert len(parts) == np_
        for f in parts:
            part = torch.load(f)
            assert not merged.keys() & part.keys()  # no sample served twice in an epoch
            merged.update(part)
        got[np_] = merged
    assert got[1].keys() == got[2].keys() and len(got[1]) == 2 * (N_TRAIN // 32 * 32)
    for key, sample in got[1].items():
        assert torch.equal(sample, got[2][key]), key
    # The augmentation did something, and something else in the next epoch.
    index = next(i for e, i in got[1] if e == 0 and (1, i) in got[1])
    assert not torch.equal(got[1][(0, index)], got[1][(1, index)])


def train_args(data: Path, run: Path, *extra: str) -> list[str]:
    return [f"data.path={data}", f"run.dir={run}", "data.batch_size=16",
            "data.val_batch_size=16", "optim.lr=0.05", "optim.momentum=0.9",
            "log.every_steps=5", "log.tensorboard=false", "checkpoint.every_steps=0",
            "run.epochs=2", "image.augment=crop_flip", "image.crop_padding=2", *extra]


def final_state(run: Path) -> dict:
    found = ckfolder.find_latest(run / "checkpoints")
    assert found is not None, f"no checkpoint in {run}"
    return ckformat.decode(found.data, str(found.path))


def test_stop_and_resume_with_augmentation_is_bitwise_identical(ranks, make_data,
                                                                tmp_path: Path) -> None:
    data = make_data(N_TRAIN, N_VAL)
    full, cut, plain = tmp_path / "full", tmp_path / "cut", tmp_path / "plain"
    ranks(TRAIN, *train_args(data, full), np=2, timeout=BOUND)
    ranks(TRAIN, *train_args(data, cut, "run.stop_at_step=7"), np=2, timeout=BOUND)  # mid-epoch
    assert [s for s, _ in ckfolder.list_checkpoints(cut / "checkpoints")] == [7]
    out = ranks(TRAIN, *train_args(data, cut), np=2, timeout=BOUND).output
    assert "resumed from" in out
    a, b = final_state(full), final_state(cut)
    assert a["step"] == b["step"] == 2 * (N_TRAIN // 32)
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    # Control: without augmentation the same run ends elsewhere.
    ranks(TRAIN, *train_args(data, plain, "image.augment=none"), np=2, timeout=BOUND)
    c = final_state(plain)
    assert any(not torch.equal(a["model"][k], c["model"][k]) for k in a["model"])
