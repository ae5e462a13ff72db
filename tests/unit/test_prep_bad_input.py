"""One rule for every recipe of `hpcdp prep`: bad input exits 2, names the file (and the line
where there is one) or the option, and writes nothing."""

from __future__ import annotations

import re
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest
from PIL import Image

from hpcdp.data.prep import cli as prep


def _arrays(d: Path) -> tuple[list[str], str]:
    (d / "x.npy").write_text("hello, not an array")
    return ["--x", str(d / "x.npy")], rf"{d}/x.npy: not a \.npy file: it holds text"


def _digits(d: Path) -> tuple[list[str], str]:
    return ["--val-fraction", "1.5"], r"--val-fraction must be in \[0, 1\), got 1.5"


def _cifar(d: Path) -> tuple[list[str], str]:
    with tarfile.open(d / "cifar.tar.gz", "w:gz") as tar:
        tar.add(__file__, arcname="cifar-10-batches-py/readme.txt")
    return ["--archive", str(d / "cifar.tar.gz")], rf"{d}/cifar\.tar\.gz"


def _synthetic(d: Path) -> tuple[list[str], str]:
    return ["--samples", "10", "--shape", "3,x,3"], r"--shape '3,x,3': 'x' is not a positive"


def _markov(d: Path) -> tuple[list[str], str]:
    return ["--docs", "0"], r"--docs and --val-docs must be at least 1"


def _clicks(d: Path) -> tuple[list[str], str]:
    return ["--rows", "100", "--click-rate", "1.5"], r"--click-rate"


def _images(d: Path) -> tuple[list[str], str]:
    for label in ("cat", "dog"):
        (d / "photos" / label).mkdir(parents=True)
        for i in range(3):
            Image.new("RGB", (9, 7), (i * 40, 0, 0)).save(d / "photos" / label / f"{i}.png")
    (d / "photos" / "dog" / "9.jpg").write_bytes(b"\xff\xd8\xff not a whole JPEG")
    return (["--root", str(d / "photos"), "--size", "8", "--val-fraction", "0.3"],
            rf"{d}/photos/dog/9\.jpg")


def _text(d: Path) -> tuple[list[str], str]:
    (d / "a.jsonl").write_text('{"text": "fine"}\n{"text": "also fine"}\n{"text": 3}\n')
    return ["--files", str(d / "a.jsonl")], rf"{d}/a\.jsonl: line 3"


def _criteo(d: Path) -> tuple[list[str], str]:
    good = "\t".join(["1", *["2"] * 13, *["0000abcd"] * 26])
    bad = "\t".join(["1", "2", "three", *["2"] * 11, *["0000abcd"] * 26])
    (d / "day.txt").write_text("\n".join([good, good, bad, good]) + "\n")
    (d / "val.txt").write_text(good + "\n")
    return (["--files", str(d / "day.txt"), "--val-files", str(d / "val.txt"), "--buckets", "9"],
            rf"{d}/day\.txt: line 3: count I2 = 'three'")


def _npz(d: Path) -> tuple[list[str], str]:
    (d / "part-0.npz").write_bytes(b"PK\x03\x04 but no archive follows")
    return ["--files", str(d / "part-*.npz")], rf"{d}/part-0\.npz"


BAD: dict[str, Callable[[Path], tuple[list[str], str]]] = {
    "arrays": _arrays, "digits": _digits, "cifar": _cifar, "synthetic": _synthetic,
    "markov": _markov, "clicks": _clicks, "images": _images, "text": _text, "criteo": _criteo,
    "npz": _npz,
}


def test_the_table_covers_every_recipe() -> None:
    assert sorted(BAD) == sorted(["arrays", "digits", "cifar", "synthetic", *prep.RECIPES])


@pytest.mark.parametrize("recipe", sorted(BAD))
def test_bad_input_exits_2_naming_it_with_nothing_written(tmp_path: Path, capsys,
                                                          recipe: str) -> None:
    inputs = tmp_path / "in"
    inputs.mkdir()
    args, problem = BAD[recipe](inputs)
    out = tmp_path / "out"
    assert prep.main([recipe, *args, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "error" in err and re.search(problem, err), err
    assert "Traceback" not in err
    assert not out.exists() or not list(out.iterdir())  # no file, no part, no temporary
