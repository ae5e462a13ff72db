"""WebDataset-style tar shards as input of the image recipe: the same file as the equivalent
folder, and what a shard may not hold."""

from __future__ import annotations

import importlib.util
import io
import tarfile
from pathlib import Path

import h5py
import numpy as np
import pytest

from hpcdp.data.prep.images import shards
from hpcdp.data.prep.images.recipe import main

REPO = Path(__file__).resolve().parents[2]


def shapes_folder(root: Path) -> None:
    spec = importlib.util.spec_from_file_location("make_image_folder",
                                                  REPO / "scripts" / "make_image_folder.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.make_folder(str(root), 7, classes=3, extras=False)


def add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def to_shards(src: Path, tars: Path, folder: Path) -> None:
    """The images of `src` as two shards (samples interleaved over them, each with a .json
    member the recipe skips) and as the folder they are equivalent to."""
    tars.mkdir(parents=True)
    images = [(label, p) for label, c in enumerate(sorted(d for d in src.iterdir()))
              for p in sorted(c.iterdir())]
    with tarfile.open(tars / "a.tar", "w") as a, tarfile.open(tars / "b.tar", "w") as b:
        for i, (label, path) in enumerate(images):
            key = f"{label}-{path.stem}"
            tar = (a, b)[i % 2]
            add(tar, f"{key}{path.suffix}", path.read_bytes())
            add(tar, f"{key}.cls", f"{label}\n".encode())
            add(tar, f"{key}.json", b"{}")
            (folder / str(label)).mkdir(parents=True, exist_ok=True)
            (folder / str(label) / f"{key}{path.suffix}").write_bytes(path.read_bytes())


def test_shards_give_the_same_file_as_the_equivalent_folder(tmp_path: Path) -> None:
    shapes_folder(tmp_path / "src")
    to_shards(tmp_path / "src", tmp_path / "t" / "data", tmp_path / "f" / "data")
    common = ["--size", "12", "--val-fraction", "0.3", "--seed", "3", "--block-mib", "0.002"]
    assert main(["--root", str(tmp_path / "t" / "data"), "--out", str(tmp_path / "o1"),
                 *common]) == 0
    assert main(["--root", str(tmp_path / "f" / "data"), "--out", str(tmp_path / "o2"),
                 *common]) == 0
    for split in ("train.h5", "val.h5"):
        with h5py.File(tmp_path / "o1" / split) as a, h5py.File(tmp_path / "o2" / split) as b:
            assert a["x"].shape[0] > 0
            for name in ("x", "y"):
                np.testing.assert_array_equal(a[name][...], b[name][...])
            assert set(a.attrs) == set(b.attrs)
            for key in a.attrs:
                np.testing.assert_array_equal(a.attrs[key], b.attrs[key])
    assert sorted(p.name for p in (tmp_path / "o1").iterdir()) == ["train.h5", "val.h5"]


def one_shard(path: Path, members: list[tuple[str, bytes]]) -> Path:
    path.mkdir(parents=True)
    with tarfile.open(path / "s.tar", "w") as tar:
        for name, data in members:
            add(tar, name, data)
    return path


@pytest.mark.parametrize(("members", "problem"), [
    ([("x/0001.jpg", b"j" * 40), ("x/0001.cls", b"0")], "over the"),
    ([("0001.jpg", b"jpg")], "no 0001.cls label member"),
    ([("0001.jpg", b"jpg"), ("0001.cls", b"one")], "is not a class index"),
    ([("0001.jpg", b"jpg"), ("0001.cls", b"7" * 40)], "a label of 40 bytes"),
    ([("0001.cls", b"1")], "has a label but no image"),
    ([("0001.jpg", b"jpg"), ("0001.cls", b"1")], "class(es) 0 have no training images"),
])
def test_a_bad_shard_is_named(tmp_path: Path, monkeypatch, capsys, members, problem) -> None:
    monkeypatch.setattr(shards, "MAX_IMAGE_BYTES", 32)
    root = one_shard(tmp_path / "in", members)
    assert main(["--root", str(root), "--out", str(tmp_path / "o"), "--size", "8"]) == 2
    err = capsys.readouterr().err
    assert problem in err and str(root) in err
    assert not (tmp_path / "o").exists()
