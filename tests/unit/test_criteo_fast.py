"""The C-speed parser: the rows `criteo.parse_lines` reads from good lines, and None (so
that parse_lines names or skips it) whenever a line is not plainly good."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcdp.data.prep.clicks import criteo as cr
from hpcdp.data.prep.clicks.criteo_fast import fast_rows

COUNT = st.sampled_from(["", "0", "7", "-1", "-0", "007", "12", "9" * 18, "-" + "9" * 18])
HEX = st.sampled_from(["", "0", "a", "FF", "deadBEEF", "12345678", "ffffffff", "00000000"])
ODD = st.sampled_from(["", "-", "--1", "1-", "1.5", "+3", " 1", "0x1", "é", "9" * 19, "123456789",
                       "g", "2", "\r", "1\r", "\t"])


@st.composite
def lines(draw: st.DrawFn) -> bytes:
    """A good line, or one with a field changed to something odd (maybe still good)."""
    fields = [draw(st.sampled_from(["0", "1"])), *draw(st.lists(COUNT, min_size=13,
                                                                 max_size=13)),
              *draw(st.lists(HEX, min_size=26, max_size=26))]
    if draw(st.booleans()):
        fields[draw(st.integers(0, 39))] = draw(ODD)
    return "\t".join(fields).encode()


@settings(max_examples=100, deadline=None)
@given(st.lists(lines(), min_size=1, max_size=6), st.booleans())
def test_fast_rows_equal_parse_lines_or_step_aside(batch: list[bytes], end: bool) -> None:
    buf = b"\n".join(batch) + (b"\n" if end else b"")
    got = fast_rows(buf)
    want = cr.parse_lines(buf.split(b"\n")[: len(batch)], "f", skip_bad=True)
    plain_good = want.skipped == 0 and all(batch) and b"\r" not in buf
    assert (got is not None) == plain_good
    if got is not None:
        for i, line in enumerate(batch):  # the one-line reading: the rules as written
            label, counts, values = cr.parse_line(line)
            assert (got.label[i], got.counts[i].tolist(), got.values[i].tolist()) == (
                label, counts, values)
        assert got.counts.tolist() == want.counts.tolist()
        assert got.values.dtype == want.values.dtype and got.counts.dtype == np.int64


def test_blank_lines_and_an_empty_buffer() -> None:
    line = "\t".join(["1", *["5"] * 13, *["ab"] * 26]).encode()
    assert fast_rows(line + b"\n\n" + line) is None  # a blank line: parse_lines skips it
    assert len(fast_rows(b"").label) == 0
    assert fast_rows(line).values[0, 0] == 0xAB
