"""The bounded readers and limits shared by the archive and corpus recipes (pure logic)."""

from __future__ import annotations

import gzip
import io

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcdp.data.prep import bounded
from hpcdp.data.prep.text import documents as dc
from hpcdp.data.prep.text.writer import TokenPrepError


def test_names_that_are_not_utf8_are_shown_escaped() -> None:
    assert bounded.shown(b"a\xffb.txt") == "a\\xffb.txt"
    assert bounded.shown("a\udcffb.txt") == "a\\xffb.txt"  # as os.fsdecode gives it
    assert bounded.shown("Köln.txt") == "Köln.txt"


def test_lines_are_whole_up_to_the_limit_and_cut_beyond() -> None:
    data = b"0123456789\n" + b"x" * 11 + b"\n" + b"y" * 40 + b"\nlast"
    got = list(bounded.lines(io.BytesIO(data), 10))
    assert got == [b"0123456789", b"x" * 11, b"y" * 12, b"last"]


@settings(max_examples=100, deadline=None, derandomize=True)
@given(st.lists(st.integers(0, 30), max_size=12), st.booleans(), st.integers(1, 17))
def test_lines_match_a_plain_split_at_any_chunk_size(lengths, ends, chunk) -> None:
    lines = [bytes([97 + i % 26]) * n for i, n in enumerate(lengths)]
    data = b"\n".join(lines) + (b"\n" if ends and lines else b"")
    limit = 8
    got = list(bounded.lines(io.BytesIO(data), limit, chunk))
    expected = data.split(b"\n")
    if expected and expected[-1] == b"":
        expected.pop()
    assert got == [line[: limit + 2] for line in expected]


def test_record_limit_and_expansion_budget() -> None:
    limits = dc.Limits(record_bytes=100, expansion=3)
    limits.check_record(100, "f: line 1")
    with pytest.raises(TokenPrepError, match=r"f: line 2: a record of more than 100 bytes "
                                             r"\(--max-record-bytes 100"):
        limits.check_record(101, "f: line 2")
    assert limits.budget(10) == 3 * (64 << 10)  # a small file counts as 64 KiB
    assert limits.budget(10 << 20) == 30 << 20
    assert "--max-expansion 3" in str(limits.over_budget(10, "f"))


@pytest.mark.parametrize(("line", "problem"), [
    (b'{"text": "x", "n": ' + b"1" * 4400 + b"}", "a number of more than 4300 digits"),
    (b'{"text": ' + b"[" * 50_000 + b"]" * 50_000 + b"}", "nested too deeply"),
    (b'{"text": "a\\udc80"}', r"lone surrogate \(U\+DC80\) at character 1"),
])
def test_records_python_cannot_hold_as_text_are_named(line: bytes, problem: str) -> None:
    with pytest.raises(TokenPrepError, match=f"f: line 7: .*{problem}"):
        dc.record_text(line, "text", "f: line 7")


@pytest.mark.parametrize("kind", ["string", "large_string", "string_view", "dictionary"])
def test_parquet_value_lengths_are_counted_before_decoding(tmp_path, kind: str) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    values = ["a" * 300, "b" * 10] * 3
    column = (pa.array(values).dictionary_encode() if kind == "dictionary"
              else pa.array(values, getattr(pa, kind)()))
    pq.write_table(pa.table({"text": column}), tmp_path / "t.parquet")
    path = str(tmp_path / "t.parquet")
    assert list(dc.parquet_texts(path, "text")) == values
    with pytest.raises(TokenPrepError, match=r"t.parquet: row group 0, row 0: a record of more "
                                             r"than 299 bytes"):
        list(dc.parquet_texts(path, "text", dc.Limits(record_bytes=299)))


def test_a_gzip_bomb_of_blank_lines_ends_early(tmp_path) -> None:
    """Blank lines count as `LINE_COST` bytes each: 2M of them (2 MB, far under the budget of
    100 x 64 KiB by their bytes) use it up after ~100k lines."""
    path = tmp_path / "blank.jsonl.gz"
    path.write_bytes(gzip.compress(b"\n" * 2_000_000, 9))
    with pytest.raises(TokenPrepError, match=r"blank.jsonl.gz: line (\d+): more than") as got:
        list(dc.gzip_texts(str(path), "text"))
    line = int(str(got.value).split("line ")[1].split(":")[0])
    assert line <= 100 * (64 << 10) // dc.LINE_COST + 1


def test_a_text_file_read_as_one_document_is_held_to_the_record_limit(tmp_path) -> None:
    from hpcdp.data.prep.text.corpus import Corpus

    (tmp_path / "ok.txt").write_bytes(b"x" * 100)
    (tmp_path / "long.txt").write_bytes(b"y" * 101)
    corpus = Corpus([str(tmp_path / "ok.txt"), str(tmp_path / "long.txt")], lines=False,
                    limits=dc.Limits(record_bytes=100))
    ok, long = corpus.blocks(1 << 20)
    assert list(corpus.texts(ok)) == ["x" * 100]
    with pytest.raises(TokenPrepError, match=r"long.txt \(the whole file is one document; "
                                             r"--lines makes each line one\): a record of "
                                             r"more than 100 bytes"):
        list(corpus.texts(long))
    lines = Corpus([str(tmp_path / "long.txt")], lines=True, limits=dc.Limits(record_bytes=100))
    with pytest.raises(TokenPrepError, match="byte offset 0: a record of more than 100"):
        list(lines.texts(lines.blocks(1 << 20)[0]))
