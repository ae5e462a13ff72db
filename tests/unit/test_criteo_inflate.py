"""Inflating a gzipped log a block at a time: the chunks hold the blocks' whole lines in
order, numbered from the right line; the reading limits hold (lines cut as the bounded
reader cuts them, a stream expanding past its budget or damaged refused naming the
file)."""

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


def inflate_all(path: Path, block_bytes: int, out: Path) -> list[bytes]:
    """Every chunk of gzip file `path`, written under `out` and read back."""
    inflater, chunks = cb.Inflater(str(path), block_bytes), []
    while inflater.next_chunk(str(out / f"chunk{inflater.chunks}")) is not None:
        chunks.append((out / f"chunk{inflater.chunks - 1}").read_bytes())
    return chunks


@settings(max_examples=60, deadline=None)
@given(lines=st.lists(st.binary(max_size=30).map(lambda b: b.replace(b"\n", b"")), max_size=40),
       end=st.booleans(), block=st.integers(1, 100))
def test_chunks_are_the_blocks_whole_lines_numbered(tmp_path_factory, lines: list[bytes],
                                                    end: bool, block: int) -> None:
    out = tmp_path_factory.mktemp("chunks")
    data = b"\n".join(lines) + (b"\n" if end and lines else b"")
    (out / "day.gz").write_bytes(gzip.compress(data))
    inflater, chunks = cb.Inflater(str(out / "day.gz"), block), []
    while (got := inflater.next_chunk(str(out / "c"))) is not None:
        chunk = (out / "c").read_bytes()
        assert got[:2] == (1 + b"".join(chunks).count(b"\n"), len(chunk))  # its first line
        chunks.append(chunk)
    assert b"".join(chunks) == data and inflater.finished
    for chunk in chunks:  # the lines beginning in the next `block` bytes (blocks.line_span)
        assert chunk.endswith(b"\n") or chunk is chunks[-1]
        body = chunk[:-1] if chunk.endswith(b"\n") else chunk
        assert len(chunk) <= block or b"\n" not in body[block - 1 :]
    assert [m[:2] for m in inflater.made] == [(1 + b"".join(chunks[:i]).count(b"\n"), len(c))
                                              for i, c in enumerate(chunks)]
    assert sum(m[2] for m in inflater.made) <= (out / "day.gz").stat().st_size


def test_a_chunk_whose_part_is_done_is_only_counted(tmp_path: Path) -> None:
    src = tmp_path / "day.gz"
    src.write_bytes(gzip.compress(b"".join(b"%d\t1\n" % i for i in range(1000))))
    inflater = cb.Inflater(str(src), 1000)
    assert inflater.next_chunk(None) is not None and not list(tmp_path.glob("c*"))
    first, _, _ = inflater.next_chunk(str(tmp_path / "c"))
    assert (tmp_path / "c").read_bytes().startswith(b"%d\t1\n" % (first - 1))


def test_a_huge_line_is_cut_on_disk(tmp_path: Path) -> None:
    src = tmp_path / "day.gz"
    src.write_bytes(gzip.compress(b"1\t2\n" + b"a" * (3 << 20) + b"\n0\t1\n"))
    chunks = inflate_all(src, 64 << 20, tmp_path)
    lines = b"".join(chunks).split(b"\n")
    assert [len(x) for x in lines] == [3, cr.READ_LINE_BYTES + 2, 3, 0]


def test_expanding_past_the_budget_is_refused_naming_the_file(tmp_path: Path) -> None:
    src = tmp_path / "bomb.gz"
    src.write_bytes(gzip.compress(b"\n" * (200 << 20)))  # 200 MB of blank lines
    with pytest.raises(cr.CriteoError, match=r"bomb\.gz: line 1: more than"):
        inflate_all(src, 64 << 20, tmp_path)
    assert not list(tmp_path.glob("chunk*"))


@pytest.mark.parametrize("damage", ["truncated", "crc", "not gzip"])
def test_a_damaged_stream_is_named_with_the_last_whole_line(tmp_path: Path, damage: str
                                                            ) -> None:
    data = gzip.compress(b"".join(b"1\t%d\n" % i for i in range(100_000)))
    if damage == "truncated":
        data = data[: len(data) // 2]
    elif damage == "crc":
        data = data[:-8] + bytes(8)
    else:
        data = b"1\t2\n" * 10
    (tmp_path / "day.gz").write_bytes(data)
    with pytest.raises(cr.CriteoError, match=r"day\.gz: cannot be decompressed after line \d+"):
        inflate_all(tmp_path / "day.gz", 1 << 16, tmp_path)
