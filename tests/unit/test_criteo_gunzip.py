"""Decompressing a gzipped log for block reading keeps the reading limits: lines cut as the
bounded reader cuts them, and a stream expanding past its budget refused naming the file."""

from __future__ import annotations

import gzip
import io
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcdp.data.prep import bounded
from hpcdp.data.prep.clicks import criteo as cr
from hpcdp.data.prep.clicks import criteo_blocks as cb


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=80).map(lambda b: b.replace(b"\x00", b"\n")),
       limit=st.integers(1, 9), sizes=st.lists(st.integers(1, 9), min_size=1, max_size=20))
def test_cut_lines_are_the_bounded_readers(data: bytes, limit: int, sizes: list[int]) -> None:
    cut, out, at = cb.LineCutter(limit), [], 0
    while at < len(data):
        step = sizes[len(out) % len(sizes)]
        out.append(cut(data[at : at + step]))
        at += step
    lines = b"".join(out).split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    assert lines == list(bounded.lines(io.BytesIO(data), limit, chunk=4))


def test_a_chunk_without_long_lines_passes_unchanged() -> None:
    chunk = b"abc\nde\n" * 100 + b"xy"
    assert cb.LineCutter(10)(chunk) is chunk


def test_a_huge_line_is_cut_on_disk(tmp_path: Path) -> None:
    src = tmp_path / "day.gz"
    src.write_bytes(gzip.compress(b"1\t2\n" + b"a" * (3 << 20) + b"\n0\t1\n"))
    cb.gunzip(str(src), str(tmp_path / "day"))
    lines = (tmp_path / "day").read_bytes().split(b"\n")
    assert [len(x) for x in lines] == [3, cr.READ_LINE_BYTES + 2, 3, 0]


def test_expanding_past_the_budget_is_refused_naming_the_file(tmp_path: Path) -> None:
    src = tmp_path / "bomb.gz"
    src.write_bytes(gzip.compress(b"\n" * (200 << 20)))  # 200 MB of blank lines
    with pytest.raises(cr.CriteoError, match=r"bomb\.gz: line 1: more than"):
        cb.gunzip(str(src), str(tmp_path / "bomb"))
    assert not list(tmp_path.glob("bomb.tmp-*")) and not (tmp_path / "bomb").exists()
