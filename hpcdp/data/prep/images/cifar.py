"""CIFAR-10/100 archives (binary or python version) -> train and val sources, no download.

The binary version holds records of a label byte (CIFAR-10) or a coarse and a
fine label byte (CIFAR-100), then 3,072 bytes: the 32x32 red, green and blue
planes, row-major, which is exactly the (3, 32, 32) sample layout. Label names
are text files beside the batches.

The python version holds pickled dicts (the data as a (N, 3072) uint8 array,
the labels as lists). Pickles can run code, so they are read by
`SafeUnpickler`, which builds only what those files hold: dicts, lists,
strings, bytes, numbers and NumPy arrays through the exact globals NumPy's
pickles name. Any other global (a function, a class) is refused with the
archive member's name before anything is called, so a planted pickle never
runs code.

Both versions of the same data give the same sources: train is the five
training batches in order (``data_batch_1..5``, or ``train`` for CIFAR-100),
val the test batch; y the label (CIFAR-100: the fine label, or the coarse one
with ``labels="coarse"``).
"""

from __future__ import annotations

import codecs
import io
import json
import pickle
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from hpcdp.data.prep.arrays import Source, SourceError
from hpcdp.data.prep.images.stats import channel_stats, integer_sums

RECORD_PIXELS = 3 * 32 * 32
SHAPE = (3, 32, 32)


def _latin1_encode(text: str, encoding: str = "latin1") -> bytes:
    """`_codecs.encode` as protocol-2 pickles use it for bytes: latin-1 only."""
    if encoding not in ("latin1", "latin-1"):
        raise pickle.UnpicklingError(f"refuses _codecs.encode with encoding {encoding!r}")
    return codecs.encode(text, "latin1")


def _numpy_globals() -> dict[tuple[str, str], Any]:
    """NumPy's own pickle reconstructors, under the module names old and new NumPy write."""
    from numpy._core import multiarray, numeric

    out: dict[tuple[str, str], Any] = {("numpy", "ndarray"): np.ndarray,
                                       ("numpy", "dtype"): np.dtype}
    for core in ("numpy.core", "numpy._core"):
        out[(f"{core}.multiarray", "_reconstruct")] = multiarray._reconstruct
        out[(f"{core}.numeric", "_frombuffer")] = numeric._frombuffer
    return out


class SafeUnpickler(pickle.Unpickler):
    """An unpickler that resolves only the globals CIFAR's pickles need (see module doc)."""

    def __init__(self, data: bytes, where: str) -> None:
        super().__init__(io.BytesIO(data), encoding="bytes")
        self.where = where
        self.allowed = {**_numpy_globals(), ("_codecs", "encode"): _latin1_encode}

    def find_class(self, module: str, name: str) -> Any:
        found = self.allowed.get((module, name))
        if found is None:
            raise SourceError(f"{self.where}: refused: the pickle names {module}.{name}, which "
                              "a CIFAR batch never holds (it could run code); nothing of it "
                              "was run")
        return found

    def persistent_load(self, pid: Any) -> Any:
        raise SourceError(f"{self.where}: refused: a persistent id in the pickle")


def safe_load(data: bytes, where: str) -> Any:
    try:
        return SafeUnpickler(data, where).load()
    except SourceError:
        raise
    except Exception as exc:  # noqa: BLE001 - any malformed pickle is bad input, named
        raise SourceError(f"{where}: not a readable pickle: {type(exc).__name__}: {exc}") from None


@dataclass(frozen=True)
class Batches:
    """What an archive holds, whichever version: arrays and label names."""

    kind: str  # "cifar10" or "cifar100"
    train_x: np.ndarray
    train_y: np.ndarray
    val_x: np.ndarray
    val_y: np.ndarray
    classes: list[str]


class _Split(Source):
    def __init__(self, name: str, x: np.ndarray, y: np.ndarray, params: dict[str, Any],
                 attrs: dict[str, Any]) -> None:
        super().__init__(name, len(x), SHAPE, np.dtype(np.uint8), True, params, attrs)
        self._x, self._y = x, y

    def slab(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray | None]:
        return self._x[start:stop], self._y[start:stop]


# -- reading the archive ---------------------------------------------------------------


def _members(path: str) -> dict[str, bytes]:
    """Every regular file of the archive by its base name."""
    try:
        with tarfile.open(path, "r:*") as tar:
            out = {}
            for m in tar.getmembers():
                if m.isfile():
                    fh = tar.extractfile(m)
                    if fh is not None:
                        out[m.name.rsplit("/", 1)[-1]] = fh.read()
            return out
    except FileNotFoundError:
        raise SourceError(f"--archive {path}: no such file") from None
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise SourceError(f"--archive {path}: not a readable tar archive: {exc}") from None


def _names(text: bytes, where: str) -> list[str]:
    try:
        return [line.strip() for line in text.decode("utf-8").splitlines() if line.strip()]
    except UnicodeDecodeError as exc:
        raise SourceError(f"{where}: label names are not UTF-8 text: {exc}") from None


def _records(data: bytes, where: str, label_bytes: int, label_index: int,
             classes: int) -> tuple[np.ndarray, np.ndarray]:
    size = label_bytes + RECORD_PIXELS
    if not data or len(data) % size:
        raise SourceError(f"{where}: {len(data)} bytes is not a whole number of "
                          f"{size}-byte records")
    rec = np.frombuffer(data, np.uint8).reshape(-1, size)
    y = rec[:, label_index].astype(np.int64)
    _check_labels(y, classes, where)
    return rec[:, label_bytes:].reshape(-1, *SHAPE), y


def _check_labels(y: np.ndarray, classes: int, where: str) -> None:
    bad = np.flatnonzero((y < 0) | (y >= classes))
    if len(bad):
        raise SourceError(f"{where}: record {int(bad[0])} has label {int(y[bad[0]])}, outside "
                          f"0..{classes - 1}")


def _need(members: dict[str, bytes], name: str, path: str) -> bytes:
    if name not in members:
        raise SourceError(f"--archive {path}: no member {name!r} (it holds: "
                          f"{', '.join(sorted(members)) or 'nothing'})")
    return members[name]


def _binary(members: dict[str, bytes], path: str, labels: str) -> Batches:
    if "batches.meta.txt" in members:
        classes = _names(members["batches.meta.txt"], f"{path}:batches.meta.txt")
        parts = [_records(_need(members, f"data_batch_{i}.bin", path),
                          f"{path}:data_batch_{i}.bin", 1, 0, len(classes)) for i in range(1, 6)]
        val = _records(_need(members, "test_batch.bin", path), f"{path}:test_batch.bin", 1, 0,
                       len(classes))
        return Batches("cifar10", np.concatenate([p[0] for p in parts]),
                       np.concatenate([p[1] for p in parts]), *val, classes)
    names_file = f"{labels}_label_names.txt"
    classes = _names(_need(members, names_file, path), f"{path}:{names_file}")
    index = 0 if labels == "coarse" else 1
    train = _records(_need(members, "train.bin", path), f"{path}:train.bin", 2, index,
                     len(classes))
    val = _records(_need(members, "test.bin", path), f"{path}:test.bin", 2, index, len(classes))
    return Batches("cifar100", *train, *val, classes)


def _get(d: Any, key: str, where: str) -> Any:
    if not isinstance(d, dict) or key.encode() not in d:
        keys = sorted(k.decode("utf-8", "replace") if isinstance(k, bytes) else str(k)
                      for k in d) if isinstance(d, dict) else []
        raise SourceError(f"{where}: no {key!r} in the pickled batch (it holds: "
                          f"{', '.join(keys) or type(d).__name__})")
    return d[key.encode()]


def _batch(data: bytes, where: str, label_key: str, classes: int
           ) -> tuple[np.ndarray, np.ndarray]:
    d = safe_load(data, where)
    x = _get(d, "data", where)
    if not isinstance(x, np.ndarray) or x.dtype != np.uint8 or x.ndim != 2 \
            or x.shape[1] != RECORD_PIXELS:
        raise SourceError(f"{where}: 'data' must be a uint8 array of shape (N, 3072), got "
                          f"{getattr(x, 'dtype', type(x).__name__)} {getattr(x, 'shape', '')}")
    labels = _get(d, label_key, where)
    if not isinstance(labels, (list, np.ndarray)) or len(labels) != len(x) \
            or not all(isinstance(v, (int, np.integer)) for v in labels):
        raise SourceError(f"{where}: {label_key!r} must be {len(x)} integer labels")
    y = np.asarray(labels, np.int64)
    _check_labels(y, classes, where)
    return np.ascontiguousarray(x).reshape(-1, *SHAPE), y


def _label_names(meta: Any, key: str, where: str) -> list[str]:
    names = _get(meta, key, where)
    if not isinstance(names, list) or not all(isinstance(n, (bytes, str)) for n in names):
        raise SourceError(f"{where}: {key!r} must be a list of names")
    return [n.decode("utf-8") if isinstance(n, bytes) else n for n in names]


def _python(members: dict[str, bytes], path: str, labels: str) -> Batches:
    if "batches.meta" in members:
        where = f"{path}:batches.meta"
        classes = _label_names(safe_load(members["batches.meta"], where), "label_names", where)
        parts = [_batch(_need(members, f"data_batch_{i}", path), f"{path}:data_batch_{i}",
                        "labels", len(classes)) for i in range(1, 6)]
        val = _batch(_need(members, "test_batch", path), f"{path}:test_batch", "labels",
                     len(classes))
        return Batches("cifar10", np.concatenate([p[0] for p in parts]),
                       np.concatenate([p[1] for p in parts]), *val, classes)
    where = f"{path}:meta"
    classes = _label_names(safe_load(_need(members, "meta", path), where),
                           f"{labels}_label_names", where)
    key = f"{labels}_labels"
    train = _batch(_need(members, "train", path), f"{path}:train", key, len(classes))
    val = _batch(_need(members, "test", path), f"{path}:test", key, len(classes))
    return Batches("cifar100", *train, *val, classes)


def read_archive(path: str, labels: str = "fine") -> Batches:
    """The batches of a CIFAR-10/100 archive, binary or python version (told by its members)."""
    members = _members(path)
    binary = any(name.endswith(".bin") for name in members)
    reader: Callable[[dict[str, bytes], str, str], Batches] = _binary if binary else _python
    return reader(members, path, labels)


def cifar(path: str, labels: str = "fine") -> list[Source]:
    """train and val sources from a CIFAR archive, with the class names and the training
    set's per-channel mean and std (as the image-folder recipe stores them)."""
    if labels not in ("fine", "coarse"):
        raise SourceError(f"--labels {labels!r}: choose fine or coarse")
    b = read_archive(path, labels)
    mean, std = channel_stats(*integer_sums(b.train_x))
    attrs = {"classes": json.dumps(b.classes), "mean": np.asarray(mean, np.float64),
             "std": np.asarray(std, np.float64)}
    params = {"dataset": b.kind, "labels": labels if b.kind == "cifar100" else "label"}
    return [_Split("train", b.train_x, b.train_y, params, attrs),
            _Split("val", b.val_x, b.val_y, params, attrs)]
