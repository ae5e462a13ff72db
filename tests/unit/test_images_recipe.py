"""The image-folder recipe on one process: layout scan, decode rules, files, failures."""

from __future__ import annotations

import importlib.util
import io
import json
from pathlib import Path

import h5py
import numpy as np
import pytest
from PIL import Image

from hpcdp.data.format.image_decode import DecodeError, decode
from hpcdp.data.prep.images import folder
from hpcdp.data.prep.images.recipe import main

REPO = Path(__file__).resolve().parents[2]


def generator():
    spec = importlib.util.spec_from_file_location("make_image_folder",
                                                  REPO / "scripts" / "make_image_folder.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def save(path: Path, mode: str = "RGB", size: tuple[int, int] = (12, 10), fmt: str = "PNG",
         colour=(200, 30, 40)) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    img = Image.new("RGB", size, colour).convert(mode)
    img.save(path, format=fmt)
    return path


# -- layout ---------------------------------------------------------------------------


def test_scan_finds_classes_extensions_in_any_case_and_counts_what_it_skips(tmp_path):
    for name in ("a.JPG", "b.Jpeg", "c.png", "d.BMP", "e.webp"):
        save(tmp_path / "cat" / name, fmt={"jpg": "JPEG", "peg": "JPEG", "png": "PNG",
                                           "bmp": "BMP", "ebp": "WEBP"}[name[-3:].lower()])
    save(tmp_path / "ant" / "deep" / "x.png")
    (tmp_path / "cat" / ".DS_Store").write_bytes(b"x")
    (tmp_path / "cat" / "readme.txt").write_text("x")
    (tmp_path / ".cache").mkdir()  # a hidden folder is no class
    layout = folder.scan(str(tmp_path))
    assert layout.classes == ["ant", "cat"]
    assert sorted(Path(e.path).name for e in layout.splits["train"]) == [
        "a.JPG", "b.Jpeg", "c.png", "d.BMP", "e.webp", "x.png"]
    assert {e.label for e in layout.splits["train"] if "cat" in e.path} == {1}
    assert (layout.skipped_hidden, layout.skipped_other) == (1, 1)
    assert "val" not in layout.splits


def test_val_fraction_split_is_seeded_per_class_and_stable(tmp_path):
    for c in ("a", "b"):
        for i in range(10):
            save(tmp_path / c / f"{i}.png")
    one = folder.scan(str(tmp_path), 0.3, seed=1)
    again = folder.scan(str(tmp_path), 0.3, seed=1)
    other = folder.scan(str(tmp_path), 0.3, seed=2)
    assert one.splits == again.splits
    assert len(one.splits["val"]) == 6 and len(one.splits["train"]) == 14
    assert {e.path for e in one.splits["val"]} != {e.path for e in other.splits["val"]}
    assert not {e.path for e in one.splits["val"]} & {e.path for e in one.splits["train"]}


@pytest.mark.parametrize(("make", "problem"), [
    (lambda d: (d / "a").mkdir(), "class 'a'"),
    (lambda d: (d / "a").mkdir() or (d / "a" / "x.txt").write_text("x"), "holds no images"),
    (lambda d: save(d / "x.png"), "no class folders"),
    (lambda d: (save(d / "train" / "a" / "1.png"), save(d / "val" / "b" / "1.png")),
     "'b' have no training folder"),
    (lambda d: (save(d / "train" / "a" / "1.png"), (d / "val" / "a").mkdir(parents=True)),
     "val/a holds no images"),
])
def test_bad_layouts_are_named(tmp_path, make, problem):
    make(tmp_path)
    with pytest.raises(folder.FolderError, match=problem):
        folder.scan(str(tmp_path))


# -- decoding -------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["L", "RGB", "RGBA", "P", "CMYK", "I;16", "LA"])
def test_every_mode_becomes_rgb(tmp_path, mode):
    path = save(tmp_path / "x.png" if mode != "CMYK" else tmp_path / "x.jpg", mode,
                fmt="JPEG" if mode == "CMYK" else "PNG")
    arr = decode(str(path), 8)
    assert arr.shape == (3, 8, 8) and arr.dtype == np.uint8


def test_transparent_pixels_become_white(tmp_path):
    img = Image.new("RGBA", (10, 10), (255, 0, 0, 0))
    img.save(tmp_path / "t.png")
    assert (decode(str(tmp_path / "t.png"), 4) == 255).all()


def test_shorter_side_to_s_then_centre_crop(tmp_path):
    bands = np.zeros((30, 60, 3), np.uint8)  # three vertical bands: red, green, blue
    bands[:, :20, 0] = bands[:, 20:40, 1] = bands[:, 40:, 2] = 255
    Image.fromarray(bands).save(tmp_path / "b.png")
    arr = decode(str(tmp_path / "b.png"), 10)  # 60x30 -> 20x10, columns 5..15 kept
    expected = np.asarray(Image.fromarray(bands).resize((20, 10), Image.Resampling.BILINEAR)
                          .crop((5, 0, 15, 10))).transpose(2, 0, 1)
    np.testing.assert_array_equal(arr, expected)
    assert arr[1, :, 3:7].min() == 255 and arr[0, :, 4:].max() == 0  # the green centre
    stretched = decode(str(tmp_path / "b.png"), 10, "stretch")
    assert stretched[0, :, 0].min() == 255 and stretched[2, :, -1].min() == 255
    padded = decode(str(tmp_path / "b.png"), 10, "pad")  # 10x5, centred on black
    assert padded[:, :2].max() == 0 and padded[:, -3:].max() == 0


def test_undecodable_files_are_named(tmp_path):
    (tmp_path / "text.jpg").write_text("hello")
    buf = io.BytesIO()
    Image.new("RGB", (64, 64), (1, 2, 3)).save(buf, "PNG")
    (tmp_path / "cut.png").write_bytes(buf.getvalue()[:60])
    for name in ("text.jpg", "cut.png"):
        with pytest.raises(DecodeError, match=f"{name}: cannot decode"):
            decode(str(tmp_path / name), 8)


# -- the recipe -----------------------------------------------------------------------


def test_recipe_writes_classes_labels_and_training_stats(tmp_path, capsys):
    generator().make_folder(str(tmp_path / "in"), per_class=8, classes=3)
    out = tmp_path / "out"
    assert main(["--root", str(tmp_path / "in"), "--out", str(out), "--size", "16",
                 "--val-fraction", "0.25"]) == 0
    with h5py.File(out / "train.h5") as f, h5py.File(out / "val.h5") as g:
        assert f["x"].shape == (18, 3, 16, 16) and g["x"].shape == (6, 3, 16, 16)
        assert json.loads(f.attrs["classes"]) == ["disc", "square", "triangle"]
        assert np.bincount(f["y"][...]).tolist() == [6, 6, 6]
        x = f["x"][...].astype(np.float64) / 255
        np.testing.assert_allclose(f.attrs["mean"], x.mean(axis=(0, 2, 3)), rtol=1e-12)
        np.testing.assert_allclose(f.attrs["std"], x.std(axis=(0, 2, 3)), rtol=1e-9)
        np.testing.assert_array_equal(g.attrs["mean"], f.attrs["mean"])
    assert "skipped 1 hidden and 1 other" in capsys.readouterr().out
    # Nothing replaced without --overwrite; with it, the file is replaced.
    args = ["--root", str(tmp_path / "in"), "--out", str(out), "--size", "8",
            "--val-fraction", "0.25"]
    assert main(args) == 2
    assert "train.h5 already exists; pass --overwrite" in capsys.readouterr().err
    with h5py.File(out / "train.h5") as f:
        assert f["x"].shape[2] == 16
    assert main([*args, "--overwrite"]) == 0
    with h5py.File(out / "train.h5") as f:
        assert f["x"].shape[2] == 8


def test_bad_file_stops_with_its_name_or_is_skipped_and_listed(tmp_path, capsys):
    generator().make_folder(str(tmp_path / "in"), per_class=4, classes=2, extras=False)
    (tmp_path / "in" / "disc" / "broken.jpg").write_bytes(b"\xff\xd8\xff not really")
    out = tmp_path / "out"
    args = ["--root", str(tmp_path / "in"), "--out", str(out), "--size", "8"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "1 file(s) cannot be decoded" in err and "broken.jpg" in err and "--skip-bad" in err
    assert not out.exists()
    assert main([*args, "--skip-bad"]) == 0
    printed = capsys.readouterr().out
    assert "--skip-bad left out 1 file(s)" in printed and "broken.jpg" in printed
    with h5py.File(out / "train.h5") as f:
        assert f["x"].shape[0] == 8 and f.attrs["bad_files_skipped"] == 1


def test_a_class_left_without_images_by_skip_bad_is_named(tmp_path, capsys):
    generator().make_folder(str(tmp_path / "in"), per_class=2, classes=1, extras=False)
    (tmp_path / "in" / "zebra").mkdir()
    (tmp_path / "in" / "zebra" / "z.png").write_bytes(b"not a png")
    assert main(["--root", str(tmp_path / "in"), "--out", str(tmp_path / "o"), "--size", "8",
                 "--skip-bad"]) == 2
    assert "'zebra': no training image could be decoded" in capsys.readouterr().err
