"""JSON Lines and Parquet corpora under mpirun: the files one rank writes; a bad record named
on every rank, nothing written."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from hpcdp.data.prep.text import recipe as text_prep

pytestmark = pytest.mark.parallel
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

TEXT = [sys.executable, str(Path(__file__).resolve().parents[2] / "datasets" / "text.py")]


def corpus(root: Path) -> tuple[list[str], int]:
    """Records over a plain JSON Lines file, a gzipped one and a Parquet file; the count of
    documents (a record drawn empty is none)."""
    root.mkdir()
    rng = np.random.default_rng(1)
    words = ["alpha", "beta", "Grüße", "日本", "x\ny", ""]
    docs = [" ".join(rng.choice(words, rng.integers(1, 9))) for _ in range(120)]
    lines = [json.dumps({"text": d}).encode() for d in docs]
    (root / "a.jsonl").write_bytes(b"\n".join(lines[:50]) + b"\n")
    (root / "b.jsonl.gz").write_bytes(gzip.compress(b"\n".join(lines[50:80])))
    pq.write_table(pa.table({"text": docs[80:]}), root / "c.parquet", row_group_size=7)
    return [str(root / "*")], sum(1 for d in docs if d)


@pytest.mark.parametrize("tokenizer", ["bytes", "bpe"])
def test_records_on_two_ranks_write_what_one_rank_writes(ranks, tmp_path: Path,
                                                         tokenizer: str) -> None:
    files, count = corpus(tmp_path / "c")
    args = ["--files", *files, "--val-fraction", "0.2", "--tokenizer",
            tokenizer, "--vocab-size", "300"]
    assert text_prep.main([*args, "--out", str(tmp_path / "one")]) == 0
    run = ranks(TEXT, *args, "--out", str(tmp_path / "two"), np=2, timeout=120)
    assert "on 2 rank(s)" in run.output
    for split in ("train.h5", "val.h5"):
        with h5py.File(tmp_path / "one" / split) as a, h5py.File(tmp_path / "two" / split) as b:
            for name in ("tokens", "doc_offsets"):
                np.testing.assert_array_equal(a[name][...], b[name][...])
            assert dict(a.attrs) == dict(b.attrs)
    with h5py.File(tmp_path / "two" / "train.h5") as f:
        total = f.attrs["num_documents"] + h5py.File(tmp_path / "two" / "val.h5").attrs[
            "num_documents"]
    assert total == count < 120
    if tokenizer == "bpe":
        assert (tmp_path / "one" / "tokenizer.json").read_bytes() == (
            tmp_path / "two" / "tokenizer.json").read_bytes()


def test_a_bad_record_is_named_on_every_rank(ranks, tmp_path: Path) -> None:
    files, _ = corpus(tmp_path / "c")
    bad = tmp_path / "c" / "a.jsonl"
    lines = bad.read_bytes().split(b"\n")
    lines[40] = b'{"txt": "misspelt"}'
    bad.write_bytes(b"\n".join(lines))
    out = tmp_path / "out"
    run = ranks(TEXT, "--files", *files, "--out", str(out), np=2, timeout=90, expect_ok=False)
    assert not run.timed_out and run.returncode != 0, run.describe()
    problem = f"{bad}: line 41: the record has no field 'text'"
    for rank in (0, 1):
        assert f"[rank {rank}] datasets/text.py: error: {problem}" in run.output, run.describe()
    assert not (out / "train.h5").exists() and not (out / "val.h5").exists()
