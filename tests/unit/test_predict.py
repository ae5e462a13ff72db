"""hpcdp predict: image files decoded, cropped and normalised as training data, in batches."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from hpcdp.data.format.image_decode import fit
from hpcdp.export import bundle
from hpcdp.export.command import class_names, normalisation
from hpcdp.export.load import load
from hpcdp.export.predict import main, normalise, predict, read_image
from hpcdp.models import spec as specs

SPEC = {"name": "digits_cnn", "in_channels": 1, "num_classes": 3, "width": 4,
        "cifar_stem": False, "image_size": 8}
INPUT = {"layout": "NCHW", "channels": 1, "image_size": 8, "scale": 255.0, "mean": 0.5,
         "std": 0.25, "num_classes": 3, "class_names": ["zero", "one", "two"]}


def test_shorter_side_then_the_centre_square() -> None:
    strip = np.zeros((8, 16, 3), np.uint8)  # 16 wide, 8 high: thirds red, green, blue
    strip[:, :4, 0] = strip[:, 4:12, 1] = strip[:, 12:, 2] = 255
    out = fit(Image.fromarray(strip), 4)
    assert out.size == (4, 4)
    middle = np.asarray(out)[:, 1:3]
    assert (middle[..., 1] == 255).all() and (middle[..., [0, 2]] == 0).all()
    tall = fit(Image.new("L", (10, 30)), 5)
    assert tall.size == (5, 5)


@pytest.fixture
def export_dir(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    net = specs.build(SPEC)
    return bundle.write(tmp_path / "exp", specs.own_tensors(net),
                        {"task": "image", "model": SPEC, "input": INPUT})


def test_predictions_are_the_model_on_the_training_transform(export_dir: Path,
                                                             tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    arrays = [rng.integers(0, 256, (8, 8), dtype=np.uint8) for _ in range(3)]
    files = []
    for i, a in enumerate(arrays):
        files.append(tmp_path / f"img{i}.png")
        Image.fromarray(a).save(files[-1])
    assert (read_image(files[0], 8, 1)[0] == arrays[0]).all()  # 8x8 stays as it is
    net, config = load(export_dir)
    got = predict(net, config, files, top=2, batch=2)  # two batches
    x = (torch.from_numpy(np.stack(arrays)[:, None]).float() / 255 - 0.5) / 0.25
    with torch.no_grad():
        probs = torch.softmax(net(x), 1)
    for r, row in zip(got, probs):
        best = int(row.argmax())
        assert r["top"][0]["class"] == best and r["top"][0]["name"] == INPUT["class_names"][best]
        assert r["top"][0]["p"] == pytest.approx(float(row[best]), rel=1e-6)
        assert len(r["top"]) == 2


def test_a_file_that_is_no_image_is_named(export_dir: Path, tmp_path: Path, capsys) -> None:
    bad = tmp_path / "notes.png"
    bad.write_text("not an image")
    assert main([str(export_dir), str(bad)]) == 2
    assert "notes.png: cannot decode as PNG" in capsys.readouterr().err


def test_the_image_recipes_class_names_and_per_channel_statistics() -> None:
    assert class_names({"classes": '["cat", "dog"]'}) == ["cat", "dog"]
    assert class_names({"class_names": ["a", "b"]}) == ["a", "b"]
    assert class_names({}) is None
    assert normalisation({"mean": 0.5, "std": 0.25}, {}) == (0.5, 0.25)
    stats = {"mean": np.array([0.4, 0.5, 0.6]), "std": np.array([0.2, 0.25, 0.3])}
    assert normalisation({"normalize": "file"}, stats) == ([0.4, 0.5, 0.6], [0.2, 0.25, 0.3])
    with pytest.raises(bundle.ExportError, match="image.normalize='file'"):
        normalisation({"normalize": "file"}, {})
    x = np.full((1, 3, 2, 2), 255, np.uint8)
    got = normalise(x, {"scale": 255.0, "mean": [0.4, 0.5, 0.6], "std": [0.2, 0.25, 0.3]})
    assert torch.allclose(got[0, :, 0, 0], torch.tensor([3.0, 2.0, 4.0 / 3]))
