"""image.num_classes: "auto" takes the training file's class count; a set count that the
labels reach past is refused before training, naming the key, the file and the label."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest

from hpcdp import config as cfgmod
from hpcdp.config import ConfigError
from hpcdp.data.read.samples import ReaderError
from hpcdp.tasks import image


def write(path: Path, labels: list[int], classes: list[str] | None = None,
          class_names: list[str] | None = None) -> Path:
    """An image file of len(labels) 1x2x2 samples; class names as the recipes store them."""
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=np.zeros((len(labels), 1, 2, 2), np.uint8))
        y = f.create_dataset("y", data=np.asarray(labels, np.int64), chunks=(min(2, len(labels)),))
        if classes is not None:
            f.attrs["classes"] = json.dumps(classes)
        if class_names is not None:
            y.attrs["class_names"] = class_names
    return path


def config(data: Path, *overrides: str) -> cfgmod.Config:
    return cfgmod.build(None, [f"data.path={data}", *overrides])


def test_auto_is_the_default_and_a_count_or_auto_is_accepted() -> None:
    assert config(Path("d")).image.num_classes == "auto"
    assert config(Path("d"), "image.num_classes=7").image.num_classes == 7
    assert config(Path("d"), "image.num_classes=auto").image.num_classes == "auto"
    with pytest.raises(ConfigError, match="image.num_classes='seven': a class count"):
        config(Path("d"), "image.num_classes=seven")
    with pytest.raises(ConfigError, match="image.num_classes: expected int | str, got float"):
        config(Path("d"), "image.num_classes=2.5")
    with pytest.raises(ConfigError, match="image.num_classes=0: must be at least 1"):
        config(Path("d"), "image.num_classes=0")


def test_auto_counts_the_named_classes_else_the_largest_label(tmp_path: Path) -> None:
    ten = [f"c{i}" for i in range(10)]
    # Names win over labels: a class with no sample in this file still has an output.
    assert image.class_count(str(write(tmp_path / "a.h5", [0, 3, 1], classes=ten)), "y") == 10
    assert image.class_count(str(write(tmp_path / "b.h5", [0, 1], class_names=["a", "b", "c"])),
                             "y") == 3
    assert image.class_count(str(write(tmp_path / "c.h5", [2, 0, 6, 1, 5])), "y") == 7


def test_labels_past_the_named_classes_are_refused(tmp_path: Path) -> None:
    path = write(tmp_path / "a.h5", [0, 1, 4], classes=["a", "b", "c"])
    with pytest.raises(ReaderError, match=r"largest label is 4, past the 3 classes its 'classes'"):
        image.class_count(str(path), "y")


def test_from_data_fills_auto_and_the_run_records_the_number(tmp_path: Path) -> None:
    write(tmp_path / "train.h5", [0, 1, 2], classes=[f"c{i}" for i in range(10)])
    cfg = config(tmp_path)
    filled = image.from_data(cfg, tmp_path / "train.h5")
    assert filled.image.num_classes == 10 and cfg.image.num_classes == "auto"
    assert "num_classes = 10" in cfgmod.dumps(filled)
    assert image.from_data(config(tmp_path, "image.num_classes=12"),
                           tmp_path / "train.h5").image.num_classes == 12


def test_a_label_past_a_set_count_names_the_key_the_file_and_the_label(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(image, "LABEL_SCAN", 3)  # the largest label sits in the last slice
    path = write(tmp_path / "train.h5", [0, 1, 2, 3, 4, 0, 1, 9], classes=[str(i) for i in
                                                                          range(10)])
    with pytest.raises(ReaderError) as err:
        image.check_file(config(tmp_path, "image.num_classes=5"), path)
    assert str(err.value).startswith(f"{path}: its largest label is 9, past "
                                     "image.num_classes = 5")
    with pytest.raises(ReaderError, match="largest label is 9, past image.num_classes = 9 "):
        image.check_file(config(tmp_path, "image.num_classes=9"), path)  # outputs 0..8
    image.check_file(config(tmp_path, "image.num_classes=10"), path)
    image.check_file(config(tmp_path), path)  # auto: the file's own 10 classes


def test_negative_labels_are_refused(tmp_path: Path) -> None:
    path = write(tmp_path / "train.h5", [0, 1, -1, 2])
    with pytest.raises(ReaderError, match="label -1 in 'y' is negative"):
        image.check_file(config(tmp_path, "image.num_classes=3"), path)


def test_label_range_reads_in_slices_and_sees_a_rewritten_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(image, "LABEL_SCAN", 2)
    path = write(tmp_path / "a.h5", [3, 1, 7, 2, 5])
    assert image.label_range(str(path), "y") == (1, 7)
    write(path, [3, 1, 8, 2, 5, 0])  # another size: not answered from the cache
    assert image.label_range(str(path), "y") == (0, 8)


def test_setup_fills_auto_after_checking_the_files_layout_and_dtypes(tmp_path: Path) -> None:
    from hpcdp import tasks
    from hpcdp.train import setup

    task = tasks.get("image")
    write(tmp_path / "train.h5", [0, 4, 2])
    assert setup.from_data(config(tmp_path), task).image.num_classes == 5
    with h5py.File(tmp_path / "train.h5", "w") as f:
        f["x"] = np.zeros((3, 1, 2, 2), np.uint8)
        f["y"] = np.array([0.0, 2.7, np.nan], np.float32)
    with pytest.raises(ReaderError, match="labels 'y' have dtype float32; integer class"):
        setup.from_data(config(tmp_path), task)
