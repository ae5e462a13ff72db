"""JSON Lines and Parquet corpora: the same documents give the same token files as text files;
every bad record is named by file and line (row group and row)."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from hpcdp.data.prep.text import corpus as tc
from hpcdp.data.prep.text import documents as dc
from hpcdp.data.prep.text import recipe as tp
from hpcdp.data.prep.text.writer import TokenPrepError

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

#: Documents with line ends inside, text beyond ASCII, and one empty (no document anywhere).
DOCS = ["The quick brown fox.\nJumps over.\n", "Grüße aus Köln", "", "λόγος " * 40,
        "hello world " * 30, "one\ntwo\r\nthree\n", "tab\tand \"quotes\" and \\ slash",
        "日本語のテキスト", "x"] * 3


def as_text(root: Path, docs: list[str]) -> list[str]:
    root.mkdir()
    for i, doc in enumerate(docs):
        (root / f"d{i:03d}.txt").write_bytes(doc.encode())
    return [str(root / "*.txt")]


def jsonl_bytes(docs: list[str], extra: dict | None = None) -> bytes:
    return b"".join(json.dumps({"id": i, "text": d, **(extra or {})}).encode() + b"\n"
                    for i, d in enumerate(docs))


def as_jsonl(root: Path, docs: list[str]) -> list[str]:
    """The first half as plain JSON Lines (with a blank line and CRLF), the rest gzipped."""
    root.mkdir()
    half = len(docs) // 2
    plain = jsonl_bytes(docs[:half]).replace(b"\n", b"\r\n", 3)
    (root / "a.jsonl").write_bytes(plain + b"\n  \n")
    with gzip.open(root / "b.json.gz", "wb") as fh:
        fh.write(jsonl_bytes(docs[half:]))
    return [str(root / "*")]


def as_parquet(root: Path, docs: list[str], field: str = "text") -> list[str]:
    root.mkdir()
    half = len(docs) // 2
    for name, part in (("a.parquet", docs[:half]), ("b.parquet", docs[half:])):
        table = pa.table({"id": list(range(len(part))), field: part})
        pq.write_table(table, root / name, row_group_size=4)
    return [str(root / "*.parquet")]


def prepare(files: list[str], out: Path, *args: str) -> None:
    assert tp.main(["--files", *files, "--out", str(out), "--val-fraction", "0.2", *args]) == 0


def same_token_files(a: Path, b: Path) -> None:
    """Tokens, offsets and every attribute but the options' record (the file names differ)."""
    for split in ("train.h5", "val.h5"):
        with h5py.File(a / split) as fa, h5py.File(b / split) as fb:
            for name in ("tokens", "doc_offsets"):
                np.testing.assert_array_equal(fa[name][...], fb[name][...], err_msg=split)
            skip = {"source_params"}
            assert {k: v for k, v in fa.attrs.items() if k not in skip} == {
                k: v for k, v in fb.attrs.items() if k not in skip}


@pytest.mark.parametrize("tokenizer", ["bytes", "bpe"])
def test_text_jsonl_and_parquet_give_the_same_token_files(tmp_path: Path, tokenizer: str) -> None:
    args = ["--tokenizer", tokenizer, "--vocab-size", "300"]
    outs = {}
    for name, writer in (("text", as_text), ("jsonl", as_jsonl), ("parquet", as_parquet)):
        outs[name] = tmp_path / f"out-{name}"
        prepare(writer(tmp_path / name, DOCS), outs[name], *args)
    same_token_files(outs["text"], outs["jsonl"])
    same_token_files(outs["text"], outs["parquet"])
    with h5py.File(outs["jsonl"] / "train.h5") as f:
        assert f.attrs["num_documents"] + h5py.File(outs["jsonl"] / "val.h5").attrs[
            "num_documents"] == sum(1 for d in DOCS if d)
        first = f["tokens"][f["doc_offsets"][0] : f["doc_offsets"][1]]
    if tokenizer == "bytes":
        assert bytes(first[:-1].astype(np.uint8)).decode() == DOCS[0]
        return
    for name in ("jsonl", "parquet"):
        assert (outs[name] / "tokenizer.json").read_bytes() == (
            outs["text"] / "tokenizer.json").read_bytes()
    # A given tokenizer.json reads records as it reads text files.
    given = ["--tokenizer", str(outs["text"] / "tokenizer.json")]
    prepare(as_jsonl(tmp_path / "j2", DOCS), tmp_path / "given-jsonl", *given)
    prepare(as_parquet(tmp_path / "p2", DOCS), tmp_path / "given-parquet", *given)
    same_token_files(outs["text"], tmp_path / "given-jsonl")
    same_token_files(outs["text"], tmp_path / "given-parquet")


def test_field_names_the_column(tmp_path: Path) -> None:
    prepare(as_text(tmp_path / "t", DOCS), tmp_path / "o1")
    prepare(as_parquet(tmp_path / "p", DOCS, field="body"), tmp_path / "o2", "--field", "body")
    same_token_files(tmp_path / "o1", tmp_path / "o2")
    assert json.loads(h5py.File(tmp_path / "o2" / "train.h5").attrs["source_params"])[
        "field"] == "body"


def test_kinds_by_name() -> None:
    assert [dc.kind_of(p) for p in ("a.JSONL", "b.jsonl.gz", "c.Json.gz", "d.parquet", "e.json",
                                    "f.txt")] == ["jsonl", "jsonl.gz", "jsonl.gz", "parquet",
                                                  "text", "text"]
    with pytest.raises(TokenPrepError, match="x.txt.gz: gzipped input is read only as JSON"):
        dc.kind_of("x.txt.gz")


@pytest.mark.parametrize(("line", "problem"), [
    (b'{"text": "a"', "line 7: not JSON: Expecting ',' delimiter"),
    (b"plain words", "line 7: not JSON"),
    (b'{"body": "a"}', "line 7: the record has no field 'text'"),
    (b'{"text": 5}', "line 7: field 'text' is int, not a string"),
    (b'{"text": null}', "line 7: field 'text' is null, not a string"),
    (b'["text"]', "line 7: a record must be a JSON object, got list"),
    (b'{"text": "\xff"}', "line 7: invalid UTF-8 at byte 10 of the line"),
])
def test_a_bad_record_is_named_by_file_and_line(tmp_path: Path, capsys, line: bytes,
                                                problem: str) -> None:
    root = tmp_path / "c"
    root.mkdir()
    for name in ("f.jsonl", "g.jsonl.gz"):
        data = jsonl_bytes(DOCS[:5]) + b"\n" + line + b"\n" + jsonl_bytes(DOCS[:2])
        if name.endswith(".gz"):
            data = gzip.compress(data)
        (root / name).write_bytes(data)
        assert tp.main(["--files", str(root / name), "--out", str(tmp_path / "o")]) == 2
        assert f"{root / name}: {problem}" in capsys.readouterr().err
        assert not (tmp_path / "o" / "train.h5").exists()
        (root / name).unlink()


@pytest.mark.parametrize(("values", "problem"), [
    (["a", "b", None], "row group 1, row 0: column 'text' is null (type string)"),
    ([1, 2, 3], "row group 0, row 0: column 'text' is int (type int64), not a string"),
])
def test_a_bad_parquet_value_is_named_by_row_group_and_row(tmp_path: Path, capsys,
                                                           values: list, problem: str) -> None:
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"text": (values * 3)[:5]}), path, row_group_size=2)
    assert tp.main(["--files", str(path), "--out", str(tmp_path / "o")]) == 2
    assert f"{path}: {problem}" in capsys.readouterr().err
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())


def test_parquet_without_the_column_or_pyarrow(tmp_path: Path, capsys, monkeypatch) -> None:
    files = as_parquet(tmp_path / "p", DOCS)
    assert tp.main(["--files", *files, "--out", str(tmp_path / "o"), "--field", "body"]) == 2
    assert f"{tmp_path / 'p' / 'a.parquet'}: no column 'body' (see --field; it has 'id', " \
           "'text')" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)  # as if not installed
    assert tp.main(["--files", *files, "--out", str(tmp_path / "o")]) == 2
    assert "a.parquet: reading Parquet needs pyarrow (pip install pyarrow" in (
        capsys.readouterr().err)


def test_a_truncated_gzip_is_named(tmp_path: Path, capsys) -> None:
    path = tmp_path / "t.jsonl.gz"
    path.write_bytes(gzip.compress(jsonl_bytes(DOCS * 20))[:-400])
    assert tp.main(["--files", str(path), "--out", str(tmp_path / "o")]) == 2
    assert f"{path}: cannot be decompressed after line" in capsys.readouterr().err


def test_jsonl_lines_cut_into_blocks_give_each_record_once(tmp_path: Path) -> None:
    root = tmp_path / "c"
    as_jsonl(root, DOCS)
    corpus = tc.Corpus(tc.expand_files([str(root / "*")]), lines=False)
    whole = [t for b in corpus.blocks(1 << 30) for t in corpus.texts(b)]
    assert whole == [d for d in DOCS if d]
    for block_bytes in (1, 7, 64, 1000):
        blocks = corpus.blocks(block_bytes)
        assert [b.index for b in blocks] == list(range(len(blocks)))
        assert [t for b in blocks for t in corpus.texts(b)] == whole
