"""Criteo lines parsed at C speed: the whole buffer as one byte array, no Python per line.

`fast_rows` takes only buffers in which every line is one `criteo.LINE` accepts
(and no blank line, no ``\r``): the field boundaries are the positions of the
tabs and newlines, and each field's value is built one character position at a
time over all fields together (Horner's rule), its characters checked on the
way. Any line outside that makes it return None, and the caller parses the
buffer with `criteo.parse_lines`, which names the bad line or skips it: the
rules and messages stay that module's, and this one only has to be exact on
good lines (tested against it).
"""

from __future__ import annotations

import numpy as np

from hpcdp.data.prep.clicks import criteo as cr

HEX_WIDTH = 8
#: Digit value of each byte: 0-9 for decimal digits, -1 otherwise.
DECIMAL = np.full(256, -1, np.int64)
DECIMAL[np.frombuffer(b"0123456789", np.uint8)] = np.arange(10)
#: Nibble of each byte: 0-15 for hexadecimal digits (any case), -1 otherwise.
NIBBLE = np.full(256, -1, np.int64)
NIBBLE[np.frombuffer(b"0123456789abcdef", np.uint8)] = np.arange(16)
NIBBLE[np.frombuffer(b"ABCDEF", np.uint8)] = np.arange(10, 16)


def fast_rows(buf: bytes) -> cr.Rows | None:
    """The rows of `buf` (whole lines, the last one's newline optional), or None when a
    line is not plainly good (blank, ``\r``, a bad field): parse those with
    `criteo.parse_lines`."""
    a = np.frombuffer(buf, np.uint8)
    if not len(a):
        return cr.Rows.concat([])
    if a[-1] != 10:
        a = np.concatenate([a, [10]]).astype(np.uint8)
    if (a == 13).any():
        return None
    nl = np.flatnonzero(a == 10)
    tabs = np.flatnonzero(a == 9)
    n = len(nl)
    if len(tabs) != (cr.FIELDS - 1) * n or (np.bincount(np.searchsorted(nl, tabs), minlength=n)
                                           != cr.FIELDS - 1).any():
        return None
    first = np.concatenate([[0], nl[:-1] + 1])
    starts = np.concatenate([first[:, None], tabs.reshape(n, -1) + 1], axis=1)
    lengths = np.concatenate([tabs.reshape(n, -1), nl[:, None]], axis=1) - starts
    label = _label(a, starts[:, 0], lengths[:, 0])
    counts = _counts(a, starts[:, 1 : 1 + cr.DENSE], lengths[:, 1 : 1 + cr.DENSE])
    values = _values(a, starts[:, 1 + cr.DENSE :], lengths[:, 1 + cr.DENSE :])
    if label is None or counts is None or values is None:
        return None
    return cr.Rows(label, counts, values)


def _label(a: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray | None:
    first = a[starts]
    if (lengths != 1).any() or ((first != 48) & (first != 49)).any():
        return None
    return (first == 49).astype(np.uint8)


def _counts(a: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray | None:
    """Empty as 0, else an optional '-' and 1 to 18 decimal digits; one position of every
    field at a time (Horner's rule), so nothing wider than the fields is held."""
    negative = (lengths > 0) & (a[starts] == ord("-"))
    digits = lengths - negative
    if ((lengths > 0) & ((digits < 1) | (digits > 18))).any():
        return None
    value = np.zeros(lengths.shape, np.int64)
    for p in range(int(lengths.max(initial=0))):
        here = (p < lengths) & ~(negative & (p == 0))
        digit = DECIMAL[a[np.where(here, starts + p, 0)]]
        if (digit[here] < 0).any():
            return None
        value = np.where(here, value * 10 + digit, value)
    return np.where(negative, -value, value)


def _values(a: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray | None:
    """Empty as `criteo.EMPTY`, else up to 8 hexadecimal digits (any case)."""
    if (lengths > HEX_WIDTH).any():
        return None
    value = np.zeros(lengths.shape, np.int64)
    for p in range(int(lengths.max(initial=0))):
        here = p < lengths
        nibble = NIBBLE[a[np.where(here, starts + p, 0)]]
        if (nibble[here] < 0).any():
            return None
        value = np.where(here, (value << 4) | nibble, value)
    return np.where(lengths == 0, cr.EMPTY, value)
