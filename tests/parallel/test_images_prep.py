"""The image-folder recipe on 2 MPI ranks: the same file as 1 rank, bad input on every rank."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import h5py
import pytest
from h5_files import assert_same_h5

from hpcdp.data.prep.images.recipe import main

pytestmark = pytest.mark.parallel

REPO = Path(__file__).resolve().parents[2]
RECIPE = [sys.executable, str(REPO / "datasets" / "images.py")]


def make_folder(root: Path, per_class: int, classes: int) -> None:
    spec = importlib.util.spec_from_file_location("make_image_folder",
                                                  REPO / "scripts" / "make_image_folder.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.make_folder(str(root), per_class, classes=classes)




def test_two_ranks_write_the_same_files_as_one(ranks, tmp_path: Path) -> None:
    make_folder(tmp_path / "in", per_class=13, classes=3)  # 39 files of uneven bytes
    args = ["--root", str(tmp_path / "in"), "--size", "12", "--val-fraction", "0.2"]
    assert main([*args, "--out", str(tmp_path / "one")]) == 0
    run = ranks(RECIPE, *args, "--out", str(tmp_path / "two"), np=2, timeout=120)
    assert "on 2 rank(s)" in run.output
    for split in ("train.h5", "val.h5"):
        assert_same_h5(tmp_path / "one" / split, tmp_path / "two" / split)
    assert sorted(p.name for p in (tmp_path / "two").iterdir()) == ["train.h5", "val.h5"]


def test_bad_file_is_reported_by_every_rank_and_nothing_is_replaced(ranks, tmp_path: Path):
    make_folder(tmp_path / "in", per_class=6, classes=2)
    (tmp_path / "in" / "square" / "zz-bad.png").write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    out = tmp_path / "out"
    out.mkdir()
    (out / "train.h5").write_bytes(b"previous good file")
    run = ranks(RECIPE, "--root", str(tmp_path / "in"), "--out", str(out), "--size", "8",
                "--overwrite", np=2, timeout=120, expect_ok=False)
    assert not run.timed_out and run.returncode == 2, run.describe()
    for rank in (0, 1):
        assert f"[rank {rank}] datasets/images.py: error: 1 file(s) cannot be decoded" in \
            run.output, run.describe()
    assert run.output.count("zz-bad.png") >= 2
    assert (out / "train.h5").read_bytes() == b"previous good file"
    assert [p.name for p in out.iterdir()] == ["train.h5"]


def test_cifar_recipe_on_two_ranks_writes_the_same_file_as_one(ranks, tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("test_cifar",
                                                  REPO / "tests" / "unit" / "test_cifar.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    _, python = mod.cifar10_archives(tmp_path)
    args = ["--archive", str(python)]
    cifar_recipe = [sys.executable, str(REPO / "datasets" / "cifar.py")]
    ranks(cifar_recipe, *args, "--out", str(tmp_path / "one"), np=1, timeout=120)
    run = ranks(cifar_recipe, *args, "--out", str(tmp_path / "two"), np=2, timeout=120)
    assert "on 2 rank(s)" in run.output
    for split in ("train.h5", "val.h5"):
        assert_same_h5(tmp_path / "one" / split, tmp_path / "two" / split)


def test_existing_output_is_refused_by_every_rank_without_overwrite(ranks, tmp_path: Path):
    make_folder(tmp_path / "in", per_class=3, classes=2)
    out = tmp_path / "out"
    args = ["--root", str(tmp_path / "in"), "--out", str(out), "--size", "8"]
    assert main(args) == 0
    old = (out / "train.h5").read_bytes()
    run = ranks(RECIPE, *args, "--size", "10", np=2, timeout=120, expect_ok=False)
    assert not run.timed_out and run.returncode == 2, run.describe()
    for rank in (0, 1):
        assert (f"[rank {rank}] datasets/images.py: error: {out / 'train.h5'} already exists"
                in run.output), run.describe()
    assert (out / "train.h5").read_bytes() == old
    ranks(RECIPE, *args, "--size", "10", "--overwrite", np=2, timeout=120)
    assert sorted(p.name for p in out.iterdir()) == ["train.h5"]
    with h5py.File(out / "train.h5") as f:
        assert f["x"].shape == (6, 3, 10, 10)


def test_a_fifo_and_an_eps_named_jpg_are_refused_by_every_rank_unopened(ranks, tmp_path: Path):
    make_folder(tmp_path / "in", per_class=4, classes=2)
    os.mkfifo(tmp_path / "in" / "disc" / "fifo.jpg")  # an open would wait forever
    (tmp_path / "in" / "square" / "photo.jpg").write_bytes(
        b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\nshowpage\n")
    gs = tmp_path / "bin" / "gs"
    gs.parent.mkdir()
    gs.write_text(f"#!/bin/sh\ntouch {tmp_path / 'gs-ran'}\nexit 1\n")
    gs.chmod(0o755)
    out = tmp_path / "out"
    run = ranks(RECIPE, "--root", str(tmp_path / "in"), "--out", str(out), "--size", "8",
                np=2, timeout=60, expect_ok=False,
                env={"PATH": f"{gs.parent}:{os.environ['PATH']}"})
    assert not run.timed_out and run.returncode == 2, run.describe()
    for rank in (0, 1):
        assert f"[rank {rank}] datasets/images.py: error: 2 file(s) cannot be decoded" in \
            run.output, run.describe()
    assert "fifo.jpg: a FIFO, not a regular file" in run.output
    assert "photo.jpg: cannot decode as JPEG, the format its name says: it holds EPS" in \
        run.output
    assert not out.exists() and not (tmp_path / "gs-ran").exists()
