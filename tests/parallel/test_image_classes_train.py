"""A user's own 10-class JPEG folder, prepared with datasets/images.py, trains with the
bundled hpcdp/configs/imagefolder.toml and only data.path set (the class count comes
from the file), on 2 ranks; the same with image.num_classes=5 is refused on every rank
before the first step, naming the key, the file and the largest label."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from hpcdp.runtime.launcher import rank_environment

pytestmark = pytest.mark.parallel

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "hpcdp" / "configs" / "imagefolder.toml"
TAGGED = re.compile(r"\[\d+,(\d+)\]<std(?:out|err)>:((?:(?!\[\d+,\d+\]<std).)*)", re.S)
CLASSES, PER_CLASS = 10, 10  # 80 training images: one global batch of 2 x 32


def jpeg_folder(root: Path) -> None:
    """CLASSES subfolders of 12x12 JPEGs, each class its own colour plus noise."""
    rng = np.random.default_rng(0)
    for c in range(CLASSES):
        folder = root / f"class{c:02d}"
        folder.mkdir(parents=True)
        colour = np.array([25 * c, 255 - 25 * c, (80 * c) % 256], np.int16)
        for i in range(PER_CLASS):
            pixels = np.clip(colour + rng.integers(-20, 21, (12, 12, 3)), 0, 255)
            Image.fromarray(pixels.astype(np.uint8), "RGB").save(folder / f"{i}.jpg")


@pytest.fixture
def prepared(tmp_path: Path) -> Path:
    jpeg_folder(tmp_path / "photos")
    out = tmp_path / "data"
    done = subprocess.run([sys.executable, str(REPO / "datasets" / "images.py"), "--root",
                           str(tmp_path / "photos"), "--out", str(out), "--size", "8",
                           "--val-fraction", "0.2"], capture_output=True, text=True,
                          timeout=120, env=rank_environment(), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def test_a_ten_class_folder_trains_with_the_bundled_config_and_a_wrong_count_is_refused(
        ranks, prepared: Path, tmp_path: Path) -> None:
    train = [sys.executable, "-m", "hpcdp.train", "--config", str(CONFIG),
             f"data.path={prepared}", "run.max_steps=2"]
    run = tmp_path / "run"
    ranks([*train, f"run.dir={run}"], np=2, timeout=180)
    assert json.loads((run / "summary.json").read_text())["steps"] == 2
    assert "num_classes = 10" in (run / "config.toml").read_text()

    refused = tmp_path / "refused"
    done = ranks([*train, f"run.dir={refused}", "image.num_classes=5"], np=2, timeout=180,
                 expect_ok=False)
    assert done.returncode == 2 and not done.timed_out, done.describe()
    said = {int(r) for r, text in TAGGED.findall(done.output)
            if f"hpcdp train: error: {prepared / 'train.h5'}: its largest label is 9, past "
               "image.num_classes = 5" in text}
    assert said == {0, 1}, done.describe()
    assert not refused.exists()  # refused before training: no run folder, no checkpoint
