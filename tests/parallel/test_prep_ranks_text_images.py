"""Small blocks on 3 and 8 ranks: the text recipe (lines cut across blocks and ranks, the BPE's
bounded sample) and the image recipe write the files of one rank."""

from __future__ import annotations

import gzip
import importlib.util
import json
import sys
from pathlib import Path

import pytest
from h5_files import assert_same_h5

from hpcdp.data.prep.images import recipe as images
from hpcdp.data.prep.text import recipe as text
from hpcdp.data.synth import corpus as corpus_synth

pytestmark = pytest.mark.parallel

REPO = Path(__file__).resolve().parents[2]




@pytest.mark.parametrize("np_", [3, 8])  # 8: oversubscribed, some ranks without a block
def test_text_in_small_blocks_on_several_ranks(ranks, tmp_path: Path, np_: int) -> None:
    root = tmp_path / "c"
    corpus_synth.make_corpus(str(root), 60_000, files=2)
    lines = (root / "part-00000.jsonl").read_text().splitlines()
    (root / "z.jsonl.gz").write_bytes(gzip.compress("\n".join(lines[:20]).encode()))
    (root / "notes.txt").write_text("\n".join(json.loads(x)["text"][:80] for x in lines[:40]))
    args = ["--files", str(root / "*"), "--lines", "--block-mib", "0.01", "--val-fraction",
            "0.1", "--tokenizer", "bpe", "--vocab-size", "300", "--bpe-sample-bytes", "15000"]
    assert text.main([*args, "--out", str(tmp_path / "one")]) == 0
    run = ranks([sys.executable, str(REPO / "datasets" / "text.py"), *args, "--out",
                 str(tmp_path / "three")], np=np_, timeout=180)
    assert f"on {np_} rank(s)" in run.output
    for name in ("train.h5", "val.h5"):
        assert_same_h5(tmp_path / "one" / name, tmp_path / "three" / name)
    assert (tmp_path / "one" / "tokenizer.json").read_bytes() == (
        tmp_path / "three" / "tokenizer.json").read_bytes()


@pytest.mark.parametrize("np_", [8])  # 2 ranks: test_images_prep.py
def test_images_in_small_blocks_on_several_ranks(ranks, tmp_path: Path, np_: int) -> None:
    spec = importlib.util.spec_from_file_location("make_image_folder",
                                                  REPO / "scripts" / "make_image_folder.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.make_folder(str(tmp_path / "in"), 9, classes=3)
    args = ["--root", str(tmp_path / "in"), "--size", "12", "--val-fraction", "0.25",
            "--block-mib", "0.001"]  # 2 images a block
    assert images.main([*args, "--out", str(tmp_path / "one")]) == 0
    run = ranks([sys.executable, str(REPO / "datasets" / "images.py"), *args, "--out",
                 str(tmp_path / "three")], np=np_, timeout=180)
    assert f"on {np_} rank(s)" in run.output
    for name in ("train.h5", "val.h5"):
        assert_same_h5(tmp_path / "one" / name, tmp_path / "three" / name)
