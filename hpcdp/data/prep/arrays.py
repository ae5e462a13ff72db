"""Where prepared samples come from: deterministic slabs, no MPI and no HDF5 here.

A source knows its size, sample shape and dtype, and returns any row range
``[start, stop)`` on request. The content of a row never depends on which rank
asks or how rows are grouped into slabs, so 1 rank and N ranks write the same
file, and a source bigger than memory is written slab by slab.
"""

from __future__ import annotations

import math
import os
import re
import warnings
import zipfile
from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: Rows generated together by the synthetic source (a fixed unit so that the data
#: does not depend on the writer's slab boundaries).
_GEN_BYTES = 4 << 20
#: HDF5 refuses chunks of 4 GiB or more, and a chunk holds at least one sample.
MAX_SAMPLE_BYTES = (4 << 30) - 1
#: The synthetic source keeps one template per class in memory.
MAX_TEMPLATE_BYTES = 2 << 30
#: The .npy signature, and what other signatures say a file is.
NPY_MAGIC = b"\x93NUMPY"
_SIGNATURES = {
    b"PK\x03\x04": "a zip archive (an .npz? give it the .npz suffix)",
    b"\x89HDF\r\n\x1a\n": "an HDF5 file",
}


class SourceError(ValueError):
    """Bad source options or input files; the message names the file and problem."""


@dataclass
class Source:
    """A named split of samples that can be produced a row range at a time."""

    name: str
    num_samples: int
    sample_shape: tuple[int, ...]
    dtype: np.dtype
    has_labels: bool
    params: dict[str, Any] = field(default_factory=dict)
    #: More root attributes of the written file (class names, channel statistics).
    attrs: dict[str, Any] = field(default_factory=dict)

    @property
    def sample_bytes(self) -> int:
        return int(np.prod(self.sample_shape, dtype=np.int64)) * self.dtype.itemsize

    def slab(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray | None]:
        """Samples and labels of rows ``[start, stop)``."""
        raise NotImplementedError


# -- digits ---------------------------------------------------------------------------


def _check_val_fraction(val_fraction: float) -> None:
    if not 0.0 <= val_fraction < 1.0:
        raise SourceError(f"--val-fraction must be in [0, 1), got {val_fraction}")


def digits_split_indices(num_samples: int, seed: int, val_fraction: float) -> dict[str, np.ndarray]:
    """A deterministic train/val split of ``range(num_samples)``, each part in file order."""
    _check_val_fraction(val_fraction)
    perm = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed]))).permutation(
        num_samples
    )
    n_val = round(num_samples * val_fraction)
    return {"train": np.sort(perm[n_val:]), "val": np.sort(perm[:n_val])}


class _ArraysInMemory(Source):
    """A small split held in memory (digits: 1797 samples of 8x8)."""

    def __init__(self, name: str, x: np.ndarray, y: np.ndarray, params: dict[str, Any]) -> None:
        super().__init__(name, len(x), tuple(x.shape[1:]), x.dtype, True, params)
        self._x, self._y = x, y

    def slab(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray | None]:
        return self._x[start:stop], self._y[start:stop]


def digits(seed: int = 0, val_fraction: float = 0.2) -> list[Source]:
    """scikit-learn's bundled handwritten digits (no download), split into train and val.

    x is uint8 of shape (1, 8, 8): the 0..16 intensities scaled to 0..255, so
    that models normalize every uint8 dataset the same way (x / 255).
    """
    _check_val_fraction(val_fraction)  # before the (slower) load
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images = np.rint(np.asarray(bunch.images, dtype=np.float64) * (255.0 / 16.0))
    x = images.astype(np.uint8)[:, None, :, :]
    y = np.asarray(bunch.target, dtype=np.int64)
    parts = digits_split_indices(len(x), seed, val_fraction)
    params = {"val_fraction": val_fraction, "scale": "0..16 -> 0..255 uint8"}
    return [
        _ArraysInMemory(name, np.ascontiguousarray(x[idx]), y[idx], params)
        for name, idx in parts.items()
        if len(idx)
    ]


# -- synthetic ------------------------------------------------------------------------


def parse_shape(text: str) -> tuple[int, ...]:
    """``"3,32,32"`` (or ``"3x32x32"``) -> ``(3, 32, 32)``; every dimension a positive integer.

    Every part must be a number: ``3,x,3`` is refused, naming the part, rather
    than read as ``(3, 3)``.
    """
    sep = "," if "," in text or "x" not in text else "x"
    parts = [p.strip() for p in text.split(sep)]
    for part in parts:
        if not re.fullmatch(r"[0-9]+", part) or int(part) < 1:
            what = repr(part) if part else "an empty part"
            raise SourceError(
                f"--shape {text!r}: {what} is not a positive integer "
                "(expected a shape like 3,32,32)"
            )
    return tuple(int(p) for p in parts)


def _numeric_dtype(text: str) -> np.dtype:
    try:
        with warnings.catch_warnings():  # NumPy's deprecated aliases ('a') warn, then parse
            warnings.simplefilter("ignore", DeprecationWarning)
            dtype = np.dtype(text)
    except (TypeError, ValueError, SyntaxError):
        raise SourceError(f"--dtype {text!r} is not a numpy dtype") from None
    if dtype.kind not in "uif":
        raise SourceError(f"--dtype {text!r}: need an integer or floating-point dtype")
    return dtype


def check_sample_bytes(sample_shape: tuple[int, ...], dtype: np.dtype, what: str) -> int:
    """Bytes of one sample (exact, in Python integers); refused above HDF5's chunk limit."""
    nbytes = math.prod(sample_shape) * dtype.itemsize
    if nbytes > MAX_SAMPLE_BYTES:
        raise SourceError(
            f"{what}: one sample of shape {sample_shape} {dtype} is {nbytes} bytes; "
            f"HDF5 chunks hold at most {MAX_SAMPLE_BYTES} bytes"
        )
    if nbytes == 0:
        raise SourceError(f"{what}: samples of shape {sample_shape} hold no values")
    return nbytes


def _check_synthetic_size(shape: tuple[int, ...], dtype: np.dtype, classes: int) -> None:
    sample = check_sample_bytes(shape, dtype, f"--shape {','.join(map(str, shape))}")
    if classes * sample > MAX_TEMPLATE_BYTES:
        raise SourceError(
            f"synthetic: --classes {classes} x {sample} bytes per sample (--shape) needs "
            f"{classes * sample} bytes of class templates in memory; the limit is "
            f"{MAX_TEMPLATE_BYTES}"
        )


class Synthetic(Source):
    """Seeded random samples with a weak per-class pattern, so a model can learn them."""

    def __init__(
        self, name: str, num_samples: int, shape: tuple[int, ...], dtype: str, classes: int,
        seed: int, stream: int,
    ) -> None:
        if num_samples < 1:
            raise SourceError(f"synthetic {name}: --samples must be at least 1, got {num_samples}")
        if classes < 1:
            raise SourceError(f"synthetic: --classes must be at least 1, got {classes}")
        np_dtype = _numeric_dtype(dtype)
        _check_synthetic_size(shape, np_dtype, classes)
        params = {"classes": classes, "shape": list(shape), "dtype": str(np_dtype)}
        super().__init__(name, num_samples, shape, np_dtype, True, params)
        self.classes, self.seed, self.stream = classes, seed, stream
        self.gen_rows = max(1, _GEN_BYTES // self.sample_bytes)
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, 2**31])))
        # Integer samples: half class template, half noise (each 0..127), one add per row.
        self._templates = (self._draw(rng, (classes, *shape), 128) if self.dtype.kind != "f"
                           else self._draw(rng, (classes, *shape), 0))

    def _draw(self, rng: np.random.Generator, size: tuple[int, ...], high: int) -> np.ndarray:
        if self.dtype.kind == "f":
            return rng.standard_normal(size, dtype=np.float32).astype(self.dtype, copy=False)
        # The full byte range is numpy's fast path; halving in place gives 0..127.
        out = rng.integers(0, 256, size=size, dtype=np.uint8)
        return np.right_shift(out, 1, out=out) if high == 128 else out

    def _block(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        lo = k * self.gen_rows
        rows = min(self.gen_rows, self.num_samples - lo)
        rng = np.random.Generator(
            np.random.PCG64(np.random.SeedSequence([self.seed, self.stream, k]))
        )
        y = rng.integers(0, self.classes, size=rows, dtype=np.int64)
        noise = self._draw(rng, (rows, *self.sample_shape), 128)
        noise += self._templates[y]
        return noise.astype(self.dtype, copy=False), y

    def slab(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray | None]:
        xs, ys = [], []
        for k in range(start // self.gen_rows, -(-stop // self.gen_rows)):
            x, y = self._block(k)
            lo = k * self.gen_rows
            a, b = max(start, lo) - lo, min(stop, lo + len(x)) - lo
            xs.append(x[a:b])
            ys.append(y[a:b])
        if len(xs) == 1:
            return xs[0], ys[0]
        return np.concatenate(xs), np.concatenate(ys)


def synthetic(
    samples: int, shape: tuple[int, ...], dtype: str = "uint8", classes: int = 10, seed: int = 0,
    val_samples: int = 0,
) -> list[Source]:
    """`samples` training samples (and `val_samples` validation samples, drawn apart)."""
    out: list[Source] = [Synthetic("train", samples, shape, dtype, classes, seed, 0)]
    if val_samples:
        out.append(Synthetic("val", val_samples, shape, dtype, classes, seed, 1))
    return out


# -- user arrays ----------------------------------------------------------------------


def _what_it_is(head: bytes) -> str:
    """What the first bytes of a file that is not a .npy say it is, for the error message."""
    if not head:
        return "the file is empty"
    for magic, what in _SIGNATURES.items():
        if head.startswith(magic):
            return f"it is {what}"
    for end in range(len(head), max(0, len(head) - 4), -1):  # a character cut at the end
        try:
            text = head[:end].decode("utf-8")
        except UnicodeDecodeError:
            continue
        if all(ch.isprintable() or ch in "\t\r\n" for ch in text):
            return f"it holds text ({text[:20]!r}...)"
        break
    return f"it starts with the bytes {head[:8]!r}"


def read_npy_header(fh: Any, name: str) -> tuple[tuple[int, ...], bool, np.dtype, int]:
    """Shape, Fortran order, dtype and data offset of the .npy at `fh`'s position."""
    start = fh.tell()
    head = fh.read(32)
    if not head.startswith(NPY_MAGIC):
        raise SourceError(f"{name}: not a .npy file: {_what_it_is(head)}")
    fh.seek(start)
    try:
        version = np.lib.format.read_magic(fh)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(fh)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(fh)
        else:
            raise SourceError(
                f"{name}: .npy format version {version} is not supported (1.0 and 2.0 are)"
            )
    except SourceError:
        raise
    except Exception as exc:  # noqa: BLE001 - any malformed header (a literal parsed) is bad input
        raise SourceError(f"{name}: damaged .npy header: {exc}") from exc
    if any(d < 0 for d in shape):
        raise SourceError(f"{name}: damaged .npy header: negative shape {shape}")
    return tuple(shape), fortran, dtype, fh.tell()


def _npz_member_memmap(path: str, key: str) -> np.ndarray:
    """Memory-map one member of an uncompressed .npz (a zip of .npy files) in place."""
    try:
        with zipfile.ZipFile(path) as zf:
            names = [n[:-4] for n in zf.namelist() if n.endswith(".npy")]
            if key not in names:
                raise SourceError(f"{path}: no array {key!r} (it holds: {', '.join(names)})")
            info = zf.getinfo(key + ".npy")
            if info.compress_type != zipfile.ZIP_STORED:
                raise SourceError(
                    f"{path}: array {key!r} is compressed and cannot be memory-mapped; "
                    "save it with numpy.savez (not savez_compressed) or as a .npy file"
                )
        with open(path, "rb") as fh:
            fh.seek(info.header_offset)
            local = fh.read(30)
            if local[:4] != b"PK\x03\x04":
                raise SourceError(f"{path}: damaged zip entry for {key!r}")
            name_len = int.from_bytes(local[26:28], "little")
            extra_len = int.from_bytes(local[28:30], "little")
            fh.seek(info.header_offset + 30 + name_len + extra_len)
            shape, fortran, dtype, offset = read_npy_header(fh, f"{path}: array {key!r}")
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError) as exc:
        raise SourceError(f"{path}: not a valid .npz file: {exc}") from exc
    return _memmap(path, dtype, shape, fortran, offset)


def check_npy(where: str, dtype: np.dtype, shape: tuple[int, ...], fortran: bool,
              offset: int, size: int) -> None:
    """An array's header, read by `read_npy_header`, describes plain numbers in C order
    that the `size` bytes hold: never an object array, which only unpickling reads."""
    if dtype.hasobject:
        raise SourceError(f"{where}: object arrays cannot be prepared")
    need = offset + math.prod(shape) * dtype.itemsize
    if size < need:
        raise SourceError(f"{where}: truncated: {size} bytes, need {need}")
    if fortran and len(shape) > 1:
        raise SourceError(f"{where}: Fortran-ordered arrays are not supported; save a C-order "
                          "copy")


def _memmap(path: str, dtype: np.dtype, shape: tuple[int, ...], fortran: bool,
            offset: int) -> np.ndarray:
    check_npy(path, dtype, shape, fortran, offset, os.path.getsize(path))
    if math.prod(shape) == 0:
        return np.empty(shape, dtype)  # nothing to map (and mmap refuses zero bytes)
    return np.memmap(path, dtype=dtype, mode="r", shape=shape, offset=offset)


def load_array(path: str, key: str | None) -> np.ndarray:
    """A memory-mapped array from a .npy file or an uncompressed .npz member."""
    if os.path.isdir(path):
        raise SourceError(f"{path}: is a folder, not a .npy or .npz file")
    if not os.path.isfile(path):
        raise SourceError(f"{path}: no such file")
    if path.endswith(".npz"):
        if not key:
            raise SourceError(f"{path}: name the array inside the .npz (--x-key / --y-key)")
        return _npz_member_memmap(path, key)
    with open(path, "rb") as fh:
        shape, fortran, dtype, offset = read_npy_header(fh, path)
    return _memmap(path, dtype, shape, fortran, offset)


def check_labels(y: np.ndarray, y_path: str, n: int, x_path: str) -> None:
    """Labels: one non-negative integer (an int64 class index) per sample."""
    if y.ndim != 1:
        raise SourceError(f"{y_path}: labels must be one-dimensional, got shape {y.shape}")
    if y.dtype.kind not in "iub":
        raise SourceError(f"{y_path}: labels have dtype {y.dtype}; integers needed")
    if len(y) != n:
        raise SourceError(f"{x_path} has {n} samples but {y_path} has {len(y)} labels")
    if y.dtype.kind == "b" or not len(y):
        return
    low, high = int(y.min()), int(y.max())  # reads the labels once (memory-mapped)
    if low < 0:
        raise SourceError(f"{y_path}: label {low} at row {int(np.argmin(y))} is negative; "
                          "class labels are 0, 1, 2, ...")
    if high > np.iinfo(np.int64).max:
        raise SourceError(f"{y_path}: label {high} does not fit the int64 labels")


class Arrays(Source):
    """User arrays, memory-mapped: only the requested slab is ever read."""

    def __init__(self, name: str, x: np.ndarray, y: np.ndarray | None, x_path: str,
                 y_path: str | None) -> None:
        if x.ndim < 1:
            raise SourceError(f"{x_path}: holds a single value (shape ()), not an array of samples")
        if x.shape[0] == 0:
            raise SourceError(f"{x_path}: the data array is empty (shape {x.shape})")
        if x.dtype.kind not in "buif":
            raise SourceError(f"{x_path}: data dtype {x.dtype} is not numeric")
        check_sample_bytes(tuple(x.shape[1:]), x.dtype, x_path)
        if y is not None:
            check_labels(y, y_path or "", len(x), x_path)
        params = {"x": os.path.basename(x_path), "y": os.path.basename(y_path or "")}
        super().__init__(name, len(x), tuple(x.shape[1:]), x.dtype, y is not None, params)
        self._x, self._y = x, y

    def slab(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray | None]:
        y = None if self._y is None else np.asarray(self._y[start:stop], dtype=np.int64)
        return np.asarray(self._x[start:stop]), y


def arrays(x_path: str, y_path: str | None = None, x_key: str | None = "x",
           y_key: str | None = "y", split: str = "train") -> list[Source]:
    """One split from user arrays (.npy, or members of an uncompressed .npz)."""
    x = load_array(x_path, x_key)
    y = None
    if y_path:
        y = load_array(y_path, y_key)
    elif x_path.endswith(".npz") and y_key:
        y = load_array(x_path, y_key)
        y_path = x_path
    return [Arrays(split, x, y, x_path, y_path)]
