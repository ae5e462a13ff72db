"""Two-rank all-reduces give every rank the same bits (run on 2 ranks under Gloo).

For each op (sum, average, min, max, product) and each dtype Horovod's torch
all-reduce takes (float16, float32, float64, int32, int64), every pair of
special values (NaN with a payload of each rank's own, +-0, +-inf, denormals,
extremes) meets in both orders, followed by random
values, at 256 KiB (hpcdp's Gloo build reduces that in one exchange) and one
element more (Gloo's ring). Every rank's result must have the bits of every
other's, and equal a NumPy reference from both ranks' inputs where the
operation is exact: a sum, product or average of two values is one rounding;
min and max are exact except where IEEE leaves the choice open (a NaN, or
+0 against -0), where the result must be one of the two inputs.

Gloo's float16 has a bug of its own: its assignment skips the store when the
new value equals the old bits read as a number (gloo::float16::operator!=), so
`a + b` gives `a` where the sum's value equals a's bits read as an integer
(a denormal of bits 1 plus 1.0), in the pair exchange as in the ring. Those
float16 elements are left out of the reference check (not out of the
same-bits check).
"""

from __future__ import annotations

import sys

import horovod.torch as hvd
import numpy as np
import torch

# The pair all-reduce's limit (scripts/horovod-gloo-pair-allreduce.patch).
PAIR_MAX_BYTES = 256 * 1024

FLOATS = {torch.float32: (np.float32, np.int32), torch.float64: (np.float64, np.int64),
          torch.float16: (np.float16, np.int16)}
# Horovod's torch all-reduce takes int32, int64, float16, float32 and float64.
INTS = {torch.int32: np.int32, torch.int64: np.int64}
OPS = {"min": hvd.Min, "max": hvd.Max, "sum": hvd.Sum, "average": hvd.Average,
       "product": hvd.Product}


def nan_with_payload(ftype: type, bits_type: type, payload: int) -> np.ndarray:
    """A quiet NaN whose low mantissa bits are `payload` (ranks' NaNs differ)."""
    quiet = np.array([np.nan], dtype=ftype).view(bits_type)
    return (quiet | bits_type(payload)).view(ftype)


def specials(ftype: type, bits_type: type, rank: int) -> np.ndarray:
    info = np.finfo(ftype)
    tiny_denormal = info.smallest_subnormal
    values = np.array([0.0, -0.0, np.inf, -np.inf, tiny_denormal, -tiny_denormal,
                       tiny_denormal * 3, info.tiny, 1.0, -1.5, info.max, -info.max],
                      dtype=ftype)
    return np.concatenate([nan_with_payload(ftype, bits_type, rank + 1), values])


def float_inputs(ftype: type, bits_type: type, elems: int) -> list[np.ndarray]:
    """Each rank's input: every pair of specials (rank 0's i-th against rank 1's j-th),
    then random values of both signs, some of them denormal."""
    per_rank = [specials(ftype, bits_type, r) for r in range(2)]
    k = len(per_rank[0])
    grid = [np.repeat(per_rank[0], k), np.tile(per_rank[1], k)]
    out = []
    for r in range(2):
        rng = np.random.default_rng(100 + r)
        rest = rng.standard_normal(elems - k * k).astype(ftype)
        rest[::7] *= np.finfo(ftype).smallest_subnormal * 5  # denormals and zeros
        out.append(np.concatenate([grid[r], rest]))
    return out


def int_inputs(itype: type, elems: int) -> list[np.ndarray]:
    """Small values, so that sums and products stay in range in every dtype."""
    info = np.iinfo(itype)
    low, high = max(info.min, -11), min(info.max, 11)
    return [np.random.default_rng(200 + r).integers(low, high + 1, elems).astype(itype)
            for r in range(2)]


def same_bits_everywhere(result: torch.Tensor, bits_type: type, what: str) -> None:
    bits = torch.from_numpy(result.numpy().view(bits_type).copy())
    everyone = hvd.allgather(bits.unsqueeze(0), name=f"bits.{what}")
    for i in range(1, hvd.size()):
        differ = (everyone[i] != everyone[0]).nonzero().flatten()
        assert differ.numel() == 0, (
            f"{what}: rank {i} has other bits than rank 0 at {differ[:5].tolist()}: "
            f"{everyone[0][differ[:5]].tolist()} against {everyone[i][differ[:5]].tolist()}")


def gloo_half_store_skipped(want: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Where Gloo's float16 assignment may keep an input's bits instead of the result."""
    bits = [x.view(np.uint16).astype(np.float32).astype(np.float16).view(np.uint16)
            for x in (a, b)]
    want_bits = want.view(np.uint16)
    return (want_bits == bits[0]) | (want_bits == bits[1])


def check_float_reference(op: str, got: np.ndarray, a: np.ndarray, b: np.ndarray,
                          what: str) -> None:
    with np.errstate(all="ignore"):
        if a.dtype == np.float16:
            want = {"sum": a + b, "average": a + b, "product": a * b,
                    "min": np.minimum(a, b), "max": np.maximum(a, b)}[op]
            keep = ~gloo_half_store_skipped(want, a, b)
            got, a, b = got[keep], a[keep], b[keep]
        if op in ("sum", "average", "product"):
            want = a * b if op == "product" else a + b
            if op == "average":
                want = (want * a.dtype.type(0.5)).astype(a.dtype)
            nan = np.isnan(want)
            assert np.array_equal(np.isnan(got), nan), f"{what}: NaNs where the reference has none"
            if op == "average":  # Horovod scales after the sum: one more rounding
                tiny = np.finfo(a.dtype).smallest_subnormal
                assert np.allclose(got[~nan], want[~nan], rtol=1e-3, atol=2 * tiny), what
            else:
                bad = np.flatnonzero(~nan & (got.view(f"u{a.dtype.itemsize}")
                                             != want.view(f"u{a.dtype.itemsize}")))
                assert bad.size == 0, (
                    f"{what}: differs from the NumPy reference at {bad[:4].tolist()}: "
                    f"{a[bad[:4]].tolist()} and {b[bad[:4]].tolist()} gave "
                    f"{got[bad[:4]].tolist()}, not {want[bad[:4]].tolist()}")
            return
        want = np.minimum(a, b) if op == "min" else np.maximum(a, b)
        open_choice = np.isnan(a) | np.isnan(b) | ((a == 0) & (b == 0))
        exact = ~open_choice
        assert np.array_equal(got[exact], want[exact]), f"{what}: differs from np.{op}imum"
        width = a.dtype.itemsize
        got_bits, a_bits, b_bits = (x[open_choice].view(f"u{width}") for x in (got, a, b))
        assert ((got_bits == a_bits) | (got_bits == b_bits)).all(), \
            f"{what}: a NaN or a zero that is neither rank's input"


def check_floats(ops: list[str]) -> int:
    r, count = hvd.rank(), 0
    for dtype, (ftype, bits_type) in FLOATS.items():
        itemsize = np.dtype(ftype).itemsize
        for elems in (PAIR_MAX_BYTES // itemsize, PAIR_MAX_BYTES // itemsize + 1):
            a, b = float_inputs(ftype, bits_type, elems)
            mine = torch.from_numpy((a, b)[r].copy())
            for op in ops:
                what = f"{op} {dtype} x{elems}"
                hop = OPS[op]
                got = hvd.allreduce(mine, op=hop, name=what)
                same_bits_everywhere(got, bits_type, what)
                check_float_reference(op, got.numpy(), a, b, what)
                count += 1
    return count


def check_ints(ops: list[str]) -> int:
    r, count = hvd.rank(), 0
    for dtype, itype in INTS.items():
        itemsize = np.dtype(itype).itemsize
        for elems in (PAIR_MAX_BYTES // itemsize, PAIR_MAX_BYTES // itemsize + 1):
            a, b = int_inputs(itype, elems)
            mine = torch.from_numpy((a, b)[r].copy())
            for op in (o for o in ops if o != "average"):
                what = f"{op} {dtype} x{elems}"
                got = hvd.allreduce(mine, op=OPS[op], name=what)
                same_bits_everywhere(got, itype, what)
                want = {"sum": a + b, "min": np.minimum(a, b), "max": np.maximum(a, b),
                        "product": a * b}[op]
                assert np.array_equal(got.numpy(), want), f"{what}: differs from NumPy"
                count += 1
    return count


def main() -> None:
    hvd.init()
    assert hvd.size() == 2, f"a two-rank check, got {hvd.size()} ranks"
    ops = sys.argv[1:] or list(OPS)  # e.g. `min max`: only those
    count = check_floats(ops) + check_ints(ops)
    hvd.join()
    print(f"rank {hvd.rank()}: {count} all-reduces agree bit for bit", flush=True)


if __name__ == "__main__":
    main()
