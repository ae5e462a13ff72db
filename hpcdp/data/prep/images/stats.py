"""Per-channel mean and standard deviation of uint8 images, from exact integer sums.

Sums of uint8 values and of their squares are exact in int64 for any dataset that
fits a file system (255**2 per value leaves room for 10**14 values), so partial
sums from any number of ranks add up to the same totals, and the statistics are
the same on 1 and N ranks.
"""

from __future__ import annotations

import numpy as np

#: Bytes of int64 values summed at once: the widened copy of a block stays small.
WIDE_BYTES = 8 << 20


def integer_sums(x: np.ndarray, rows: int | None = None
                 ) -> tuple[np.ndarray, np.ndarray, int]:
    """Exact per-channel sums and sums of squares of uint8 images (N, C, H, W), and the
    pixels per channel; `rows` images at a time (default: about `WIDE_BYTES` widened to
    int64), so memory stays small."""
    if rows is None:
        rows = max(1, WIDE_BYTES // (8 * max(1, int(np.prod(x.shape[1:])))))
    sums = np.zeros(x.shape[1], np.int64)
    squares = np.zeros(x.shape[1], np.int64)
    for a in range(0, len(x), rows):
        wide = x[a : a + rows].astype(np.int64).transpose(1, 0, 2, 3).reshape(x.shape[1], -1)
        sums += wide.sum(1)
        squares += (wide * wide).sum(1)
    return sums, squares, len(x) * int(np.prod(x.shape[2:]))


def channel_stats(sums: np.ndarray, squares: np.ndarray, pixels: int
                  ) -> tuple[list[float], list[float]]:
    """Per-channel mean and (population) std on the 0..1 scale (values / 255)."""
    mean = sums / pixels
    var = np.maximum(squares / pixels - mean * mean, 0.0)
    return [float(m / 255.0) for m in mean], [float(np.sqrt(v) / 255.0) for v in var]
