"""The image task's inputs: per-channel statistics from the file, augmentation on training
batches only."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from hpcdp.config import ConfigError, build
from hpcdp.data.read.samples import ReaderError
from hpcdp.tasks import image

CPU = torch.device("cpu")


def write(folder: Path, stats: bool = True) -> None:
    folder.mkdir(exist_ok=True)
    for name in ("train.h5", "val.h5"):
        with h5py.File(folder / name, "w") as f:
            f.create_dataset("x", data=np.full((4, 3, 2, 2), 51, np.uint8))
            f.create_dataset("y", data=np.zeros(4, np.int64))
            if stats:
                f.attrs["mean"] = np.array([0.1, 0.2, 0.3])
                f.attrs["std"] = np.array([0.5, 0.25, 0.125])


def test_file_statistics_normalise_each_channel(tmp_path: Path) -> None:
    write(tmp_path / "d")
    cfg = build(None, [f"data.path={tmp_path / 'd'}", "image.normalize=file"])
    image.check_file(cfg, tmp_path / "d" / "train.h5")
    x = torch.full((4, 3, 2, 2), 51, dtype=torch.uint8)
    got, _ = image.prepare((x, torch.zeros(4, dtype=torch.int64)), cfg, CPU)
    expected = (0.2 - torch.tensor([0.1, 0.2, 0.3])) / torch.tensor([0.5, 0.25, 0.125])
    torch.testing.assert_close(got[0, :, 0, 0], expected)
    assert x.eq(51).all()  # the reader's batch is not written to


def test_a_file_without_statistics_is_named(tmp_path: Path) -> None:
    write(tmp_path / "bare", stats=False)
    cfg = build(None, [f"data.path={tmp_path / 'bare'}", "image.normalize=file"])
    with pytest.raises(ReaderError, match="train.h5: image.normalize='file' needs"):
        image.check_file(cfg, tmp_path / "bare" / "train.h5")


def test_only_keyed_training_batches_are_augmented(tmp_path: Path) -> None:
    cfg = build(None, [f"data.path={tmp_path}", "image.augment=crop_flip"])
    assert image.sample_keys(cfg)
    assert not image.sample_keys(build(None, [f"data.path={tmp_path}"]))  # off by default
    x = torch.randint(0, 256, (8, 3, 6, 6), dtype=torch.uint8)
    y = torch.zeros(8, dtype=torch.int64)
    keys = torch.stack([torch.zeros(8, dtype=torch.int64), torch.arange(8)], 1)
    val, _ = image.prepare((x, y), cfg, CPU)
    train, _ = image.prepare((x, y, keys), cfg, CPU)
    torch.testing.assert_close(val, x.float() / 255)
    assert not torch.equal(train, val)


@pytest.mark.parametrize(("override", "problem"), [
    ("image.augment=mixup", "image.augment"),
    ("image.crop_scale=[0.5, 0.2]", "image.crop_scale"),
    ("image.crop_padding=-1", "image.crop_padding"),
    ("image.normalize=auto", "image.normalize"),
])
def test_bad_augmentation_keys_are_named(tmp_path: Path, override: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        build(None, [f"data.path={tmp_path}", override])
