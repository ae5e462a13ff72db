"""A rank's memory does not grow with the input: the text and image recipes at 1x and 8x the
input, with small blocks, peak within a small margin of each other (the recipes once held
a rank's whole share: about 4.7 bytes per input byte for text, every decoded image)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from hpcdp.data.synth import corpus as corpus_synth

pytestmark = pytest.mark.parallel

REPO = Path(__file__).resolve().parents[2]
MIB = 1 << 20
BLOCK_MIB = "0.125"


def peak_mib(tmp: Path, recipe: str, *args: str) -> float:
    """The recipe's peak resident memory on one process (`hpcdp.bench.prep_memory`)."""
    out = tmp / f"rss-{len(list(tmp.glob('rss-*')))}"
    out.mkdir()
    subprocess.run([sys.executable, "-m", "hpcdp.bench.prep_memory", "--measured", str(out),
                    str(REPO / "datasets" / f"{recipe}.py"), *args, "--out", str(out / "o")],
                   check=True, timeout=120, capture_output=True)
    record = json.loads((out / "rss-0.json").read_text())
    assert record["status"] == 0
    return record["peak_kib"] / 1024


def test_text_memory_does_not_grow_with_the_corpus(tmp_path: Path) -> None:
    corpus_synth.make_corpus(str(tmp_path / "c"), 8 * MIB, files=8)  # 1 MiB a file
    peaks = [peak_mib(tmp_path, "text", "--files", str(tmp_path / "c" / files),
                      "--block-mib", BLOCK_MIB) for files in ("part-00000.jsonl", "*")]
    assert peaks[1] - peaks[0] < 0.25 * 7, peaks  # holding the corpus: about 33 MiB more


def test_image_memory_does_not_grow_with_the_folder(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("make_image_folder",
                                                  REPO / "scripts" / "make_image_folder.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    peaks = []
    for per_class in (5, 40):  # 25 and 200 images: 3.6 and 28.8 MiB decoded at 128 x 128
        mod.make_folder(str(tmp_path / f"i{per_class}"), per_class, extras=False)
        peaks.append(peak_mib(tmp_path, "images", "--root", str(tmp_path / f"i{per_class}"),
                              "--size", "128", "--block-mib", "0.5"))
    decoded_growth = 175 * 3 * 128 * 128 / MIB
    assert peaks[1] - peaks[0] < 0.25 * decoded_growth, peaks  # holding them: all of it
