"""Criteo lines parsed at C speed: the whole buffer as one byte array, no Python per line.

`fast_rows` takes only buffers in which every line is one `criteo.LINE` accepts
(and no blank line, no ``\r``): the field boundaries are the positions of the
tabs and newlines (40 separators a line, the last a newline). The buffer is
mapped through a digit table once (each byte to its digit value, 255 for any
other byte), and each field is then read as one 64-bit word: the 8 digit bytes
from its start, gathered through a view of the mapped buffer at every byte
offset. Shifting the word left by the bytes the field lacks of 8 drops what
follows the field and leaves leading zero digits, so one test of the high
nibbles checks every character, and the 8 digits are combined within the word
by multiply-and-shift: pairs, then quads, then halves (base 16 for the
categorical values, base 10 for the counts). A count of more than 8 digits (at
most 18) is read a character at a time. Any line outside the rules makes it
return None, and the caller parses the buffer with `criteo.parse_lines`, which
names the bad line or skips it: the rules and messages stay that module's, and
this one only has to be exact on good lines (tested against it).
"""

from __future__ import annotations

import numpy as np

from hpcdp.data.prep.clicks import criteo as cr

WORD = 8  # bytes of a field read at once: the widest categorical value
MAX_COUNT_DIGITS = 18
#: Digit value of each byte: 0-9 for decimal digits, 255 otherwise.
DECIMAL = np.full(256, 255, np.uint8)
DECIMAL[np.frombuffer(b"0123456789", np.uint8)] = np.arange(10)
#: Nibble of each byte: 0-15 for hexadecimal digits (any case), 255 otherwise.
NIBBLE = np.full(256, 255, np.uint8)
NIBBLE[np.frombuffer(b"0123456789abcdef", np.uint8)] = np.arange(16)
NIBBLE[np.frombuffer(b"ABCDEF", np.uint8)] = np.arange(10, 16)
DECIMAL_BYTES, NIBBLE_BYTES = DECIMAL.tobytes(), NIBBLE.tobytes()  # for bytes.translate
#: Set in a word of digit bytes only where a byte was not a digit (255).
NOT_DIGIT = np.uint64(0xF0F0F0F0F0F0F0F0)
#: (bits, mask) of the three steps joining the 8 digits of a word (the most significant
#: in its lowest byte) into one number: each lane takes its upper neighbour as its low digits.
STEPS = ((8, 0x00FF00FF00FF00FF), (16, 0x0000FFFF0000FFFF), (32, 0x00000000FFFFFFFF))


def fast_rows(buf: bytes) -> cr.Rows | None:
    """The rows of `buf` (whole lines, the last one's newline optional), or None when a
    line is not plainly good (blank, ``\r``, a bad field): parse those with
    `criteo.parse_lines`."""
    a = np.frombuffer(buf, np.uint8)
    if not len(a):
        return cr.Rows.concat([])
    if a[-1] != 10:
        a = np.append(a, np.uint8(10))
    if (a == 13).any():
        return None
    sep = np.flatnonzero(a <= 10)  # tabs and newlines (and any other control byte: bad)
    n, rest = divmod(len(sep), cr.FIELDS)
    if rest:
        return None
    sep = sep.reshape(n, cr.FIELDS)
    if (a[sep[:, :-1]] != 9).any() or (a[sep[:, -1]] != 10).any():
        return None
    starts = np.empty_like(sep)
    starts.reshape(-1)[0] = 0
    starts.reshape(-1)[1:] = sep.reshape(-1)[:-1] + 1
    lengths = sep - starts
    label = _label(a, starts[:, 0], lengths[:, 0])
    padded = a.tobytes() + bytes(WORD)  # room for a word from the last byte
    dense = slice(1, 1 + cr.DENSE)
    counts = _counts(a, padded, starts[:, dense].ravel(), lengths[:, dense].ravel())
    values = _values(padded, starts[:, 1 + cr.DENSE :], lengths[:, 1 + cr.DENSE :])
    if label is None or counts is None or values is None:
        return None
    return cr.Rows(label, counts.reshape(n, cr.DENSE), values)


def _label(a: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray | None:
    first = a[starts]
    if (lengths != 1).any() or ((first != 48) & (first != 49)).any():
        return None
    return (first == 49).astype(np.uint8)


def _digit_words(padded: bytes, table: bytes, starts: np.ndarray, lengths: np.ndarray
                 ) -> np.ndarray | None:
    """Each field (at most 8 characters) of `padded` (the buffer and `WORD` zero bytes) as a
    word of its digits (`table`), most significant first, after leading zeros; None if a
    character is not a digit."""
    digits = padded.translate(table)
    at = np.ndarray((len(digits) - WORD,), np.dtype("<u8"), digits, 0, (1,))  # bytes i..i+7
    # a shift by 64 (an empty field) gives 0 in NumPy
    words = at[starts] << ((WORD - lengths) * 8).astype(np.uint64)
    return None if (words & NOT_DIGIT).any() else words


def _join(words: np.ndarray, base: int) -> np.ndarray:
    """The numbers that words of 8 digits in `base` hold (each byte a digit)."""
    v = words
    for bits, mask in STEPS:
        v = (v * np.uint64(base ** (bits // 8)) + (v >> np.uint64(bits))) & np.uint64(mask)
    return v.astype(np.int64)


def _values(padded: bytes, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray | None:
    """Empty as `criteo.EMPTY`, else up to 8 hexadecimal digits (any case)."""
    if (lengths > WORD).any():
        return None
    words = _digit_words(padded, NIBBLE_BYTES, starts.ravel(), lengths.ravel())
    if words is None:
        return None
    value = _join(words, 16).reshape(lengths.shape)
    value[lengths == 0] = cr.EMPTY
    return value


def _counts(a: np.ndarray, padded: bytes, starts: np.ndarray, lengths: np.ndarray
            ) -> np.ndarray | None:
    """Empty as 0, else an optional '-' and 1 to 18 decimal digits."""
    negative = (lengths > 0) & (a[starts] == ord("-"))
    digits = lengths - negative
    if ((lengths > 0) & ((digits < 1) | (digits > MAX_COUNT_DIGITS))).any():
        return None
    short = digits <= WORD
    words = _digit_words(padded, DECIMAL_BYTES, starts[short] + negative[short],
                         digits[short])
    if words is None:
        return None
    value = np.zeros(len(starts), np.int64)
    value[short] = _join(words, 10)
    if not short.all():
        wide = _wide_decimal(a, starts[~short] + negative[~short], digits[~short])
        if wide is None:
            return None
        value[~short] = wide
    return np.where(negative, -value, value)


def _wide_decimal(a: np.ndarray, starts: np.ndarray, digits: np.ndarray) -> np.ndarray | None:
    """9 to 18 decimal digits a field, a character at a time (rare in the logs)."""
    value = np.zeros(len(starts), np.int64)
    for p in range(int(digits.max(initial=0))):
        here = p < digits
        digit = DECIMAL[a[np.where(here, starts + p, 0)]].astype(np.int64)
        if (digit[here] == 255).any():
            return None
        value = np.where(here, value * 10 + digit, value)
    return value
