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
runs code. Nor can it allocate more than it holds: an array may be built only
as NumPy's own pickles build one (an empty array filled from bytes of the same
length, or a view of bytes in the pickle), with a plain numeric dtype, so a
small pickle cannot declare a large array (a direct ``numpy.ndarray(shape, ...,
strides=(0, 0))`` call is refused), and the pixels must be as many bytes as the
shape says.

Only the members of the published layout are read, by their full path in it
(``cifar-10-batches-bin/test_batch.bin``; `LAYOUTS`): a same-named file
elsewhere in the archive is ignored; the same path twice or two layouts in one
archive is refused as ambiguous; an archive or member that is not a regular
file (a FIFO would block, a link point anywhere) is refused; and each member's
declared size is checked against `MAX_MEMBER_BYTES` before a byte of it is read
(as is a header extension's, which `tarfile` would read whole, against
`MAX_HEADER_BYTES`).

Both versions of the same data give the same sources: train is the five
training batches in order (``data_batch_1..5``, or ``train`` for CIFAR-100),
val the test batch; y the label (CIFAR-100: the fine label, or the coarse one
with ``labels="coarse"``).
"""

from __future__ import annotations

import codecs
import io
import json
import lzma
import os
import pickle
import stat
import tarfile
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from hpcdp.data.prep import samples
from hpcdp.data.prep.arrays import Source, SourceError
from hpcdp.data.prep.bounded import shown
from hpcdp.data.prep.images.stats import channel_stats, integer_sums

RECORD_PIXELS = 3 * 32 * 32
SHAPE = (3, 32, 32)
#: The largest member read: the biggest published one is CIFAR-100's train (~155 MB).
MAX_MEMBER_BYTES = 160 << 20
#: The largest label-names member read (the published ones are under 2 KB).
MAX_NAMES_BYTES = 1 << 20
#: The largest tar header extension (a long name, pax attributes) read.
MAX_HEADER_BYTES = 1 << 20
EXTENSIONS = (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK, tarfile.XHDTYPE,
              tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE)
#: The dtypes a batch's arrays may have (as NumPy pickles name them).
PLAIN_DTYPES = frozenset({"b1", "i1", "u1", "i2", "u2", "i4", "u4", "i8", "u8", "f4", "f8"})


@dataclass(frozen=True)
class Layout:
    """A published archive's folder: the dataset, its version and the members read."""

    kind: str  # "cifar10" or "cifar100"
    binary: bool
    names: tuple[str, ...]  # label-name members (small)
    batches: tuple[str, ...]


LAYOUTS = {
    "cifar-10-batches-bin": Layout("cifar10", True, ("batches.meta.txt",),
                                   (*(f"data_batch_{i}.bin" for i in range(1, 6)),
                                    "test_batch.bin")),
    "cifar-10-batches-py": Layout("cifar10", False, ("batches.meta",),
                                  (*(f"data_batch_{i}" for i in range(1, 6)), "test_batch")),
    "cifar-100-binary": Layout("cifar100", True, ("fine_label_names.txt",
                                                  "coarse_label_names.txt"),
                               ("train.bin", "test.bin")),
    "cifar-100-python": Layout("cifar100", False, ("meta",), ("train", "test")),
}


def _latin1_encode(text: str, encoding: str = "latin1") -> bytes:
    """`_codecs.encode` as protocol-2 pickles use it for bytes: latin-1 only."""
    if encoding not in ("latin1", "latin-1"):
        raise pickle.UnpicklingError(f"refuses _codecs.encode with encoding {encoding!r}")
    return codecs.encode(text, "latin1")


class _Refused(pickle.UnpicklingError):
    """Something a CIFAR pickle never does, found while unpickling (named by `safe_load`)."""


class _ArrayName:
    """What ``numpy.ndarray`` resolves to in a pickle: the type `_reconstruct` is told to
    build, never called (a direct call could declare any shape over any strides)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise _Refused("a direct numpy.ndarray(...) call, which can declare an array "
                       "larger than its bytes")


def _reconstruct(subtype: Any, shape: Any, dtype: Any) -> np.ndarray:
    """NumPy's first step: an empty array, filled from bytes by its ``__setstate__``, which
    checks that they are exactly as many as the shape says."""
    from numpy._core import multiarray

    if subtype is not _ArrayName or shape != (0,):
        raise _Refused(f"an array built with shape {str(shape)[:40]} (NumPy's pickles build an "
                       "empty one, then fill it from bytes of its size)")
    return multiarray._reconstruct(np.ndarray, (0,), dtype)


def _dtype(spec: Any, align: Any = False, copy: Any = False) -> np.dtype:
    """A plain numeric dtype (no objects, records or sub-arrays: no size but its own)."""
    name = spec.decode("ascii", "replace") if isinstance(spec, bytes) else spec
    if not isinstance(name, str) or name not in PLAIN_DTYPES:
        raise _Refused(f"dtype {str(spec)[:40]!r} (a CIFAR batch holds plain numbers)")
    return np.dtype(name, bool(align), bool(copy))


def _numpy_globals() -> dict[tuple[str, str], Any]:
    """NumPy's own pickle reconstructors, under the module names old and new NumPy write;
    `_frombuffer` views bytes the pickle holds, so its array is never larger than they are."""
    from numpy._core import numeric

    out: dict[tuple[str, str], Any] = {("numpy", "ndarray"): _ArrayName,
                                       ("numpy", "dtype"): _dtype}
    for core in ("numpy.core", "numpy._core"):
        out[(f"{core}.multiarray", "_reconstruct")] = _reconstruct
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
    except _Refused as exc:
        raise SourceError(f"{where}: refused: the pickle holds {exc}; nothing of it was "
                          "built") from None
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


class _HeaderCap(tarfile.TarInfo):
    """A tar header that refuses a long-name or pax extension larger than `MAX_HEADER_BYTES`:
    `tarfile` reads such an extension whole, whatever size it declares."""

    def _proc_member(self, archive: tarfile.TarFile) -> tarfile.TarInfo:
        if self.type in EXTENSIONS and self.size > MAX_HEADER_BYTES:
            raise SourceError(f"--archive {shown(archive.name or '?')}: a tar header extension "
                              f"declares {self.size} bytes (at most {MAX_HEADER_BYTES} are "
                              "read); refused")
        return super()._proc_member(archive)


def _members(path: str) -> tuple[str, dict[str, bytes]]:
    """The layout folder of the archive and its members that the recipe reads, by base name
    (see the module doc: exact paths, each once, regular, within its size cap)."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO would block, a device not end
            raise SourceError(f"--archive {shown(path)}: not a regular file (a folder, FIFO, "
                              "device or socket); refused")
        with tarfile.open(path, "r:*", tarinfo=_HeaderCap) as tar:
            found = _scan(tar, shown(path))
    except FileNotFoundError:
        raise SourceError(f"--archive {shown(path)}: no such file") from None
    except (tarfile.TarError, OSError, EOFError, zlib.error, lzma.LZMAError) as exc:
        raise SourceError(f"--archive {shown(path)}: not a readable tar archive: "
                          f"{exc}") from None
    folders = sorted({full.split("/", 1)[0] for full in found})
    if len(folders) != 1:
        raise SourceError(f"--archive {shown(path)}: " + (
            f"holds {' and '.join(folders)}: which to read is ambiguous" if folders else
            f"holds none of the published layouts ({', '.join(LAYOUTS)}/...)"))
    return folders[0], {full.split("/", 1)[1]: data for full, data in found.items()}


def _scan(tar: tarfile.TarFile, archive: str) -> dict[str, bytes]:
    """Every member of a layout in `LAYOUTS`, by its full path; other members are skipped
    unread."""
    found: dict[str, bytes] = {}
    for member in tar:
        full = member.name.removeprefix("./")
        folder, _, base = full.partition("/")
        layout = LAYOUTS.get(folder)
        if layout is None or base not in layout.names + layout.batches:
            continue
        where = f"{archive}:{full}"
        if full in found:
            raise SourceError(f"{where}: the archive holds this member twice; which to read "
                              "is ambiguous")
        if not member.isreg():
            raise SourceError(f"{where}: not a regular file (a link, folder or device); "
                              "refused")
        cap = MAX_NAMES_BYTES if base in layout.names else MAX_MEMBER_BYTES
        if member.size > cap:
            raise SourceError(f"{where}: declares {member.size} bytes, more than any CIFAR "
                              f"member ({cap}); refused before reading it")
        fh = tar.extractfile(member)
        found[full] = fh.read() if fh is not None else b""
    return found


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


def _need(members: dict[str, bytes], name: str, where: str) -> bytes:
    if name not in members:
        raise SourceError(f"{where}/{name}: no such member (the folder holds: "
                          f"{', '.join(sorted(members)) or 'nothing the recipe reads'})")
    return members[name]


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
    if x.nbytes > len(data) or (len(x) > 1 and 0 in x.strides):
        raise SourceError(f"{where}: 'data' declares {x.nbytes} bytes of pixels, but the "
                          f"member holds {len(data)}; refused")
    labels = _get(d, label_key, where)
    if not isinstance(labels, (list, np.ndarray)) or len(labels) != len(x) \
            or not all(isinstance(v, (int, np.integer)) for v in labels):
        raise SourceError(f"{where}: {label_key!r} must be {len(x)} integer labels")
    for i, v in enumerate(labels):
        if not 0 <= v < classes:
            raise SourceError(f"{where}: record {i} has label {_number(int(v))}, outside "
                              f"0..{classes - 1}")
    return np.ascontiguousarray(x).reshape(-1, *SHAPE), np.asarray(labels, np.int64)


def _number(v: int) -> str:
    """`v` in a message: its digits, or for a huge one its size (str() of it may refuse)."""
    return str(v) if abs(v) < 10**18 else f"{'-' if v < 0 else ''}(a {v.bit_length()}-bit number)"


def _label_names(meta: Any, key: str, where: str) -> list[str]:
    names = _get(meta, key, where)
    if not isinstance(names, list) or not all(isinstance(n, (bytes, str)) for n in names):
        raise SourceError(f"{where}: {key!r} must be a list of names")
    try:
        return [n.decode("utf-8") if isinstance(n, bytes) else n for n in names]
    except UnicodeDecodeError as exc:
        raise SourceError(f"{where}: {key!r}: a name that is not UTF-8: {exc}") from None


def _batches(members: dict[str, bytes], where: str, layout: Layout, labels: str) -> Batches:
    """The batches in the layout's order (the last one val) and the label names; CIFAR-100
    takes its ``labels`` (fine or coarse) where CIFAR-10 has one."""
    many = layout.kind == "cifar100"
    if layout.binary:
        names = f"{labels}_label_names.txt" if many else layout.names[0]
        classes = _names(_need(members, names, where), f"{where}/{names}")
        label_bytes, index = (2, 0 if labels == "coarse" else 1) if many else (1, 0)

        def read(name: str) -> tuple[np.ndarray, np.ndarray]:
            return _records(_need(members, name, where), f"{where}/{name}", label_bytes,
                            index, len(classes))
    else:
        meta = f"{where}/{layout.names[0]}"
        classes = _label_names(safe_load(_need(members, layout.names[0], where), meta),
                               f"{labels}_label_names" if many else "label_names", meta)
        key = f"{labels}_labels" if many else "labels"

        def read(name: str) -> tuple[np.ndarray, np.ndarray]:
            return _batch(_need(members, name, where), f"{where}/{name}", key, len(classes))
    train = [read(name) for name in layout.batches[:-1]]
    x, y = train[0] if len(train) == 1 else (np.concatenate([t[0] for t in train]),
                                             np.concatenate([t[1] for t in train]))
    return Batches(layout.kind, x, y, *read(layout.batches[-1]), classes)


def read_archive(path: str, labels: str = "fine") -> Batches:
    """The batches of a CIFAR-10/100 archive, binary or python version (told by its folder)."""
    folder, members = _members(path)
    return _batches(members, f"{shown(path)}:{folder}", LAYOUTS[folder], labels)


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


@dataclass(frozen=True)
class Archive:
    """What the CIFAR recipe's splits are made from."""

    archive: str
    labels: str


def _options(p: Any) -> None:
    p.add_argument("--archive", required=True, help="the .tar.gz as published")
    p.add_argument("--labels", choices=("fine", "coarse"), default="fine",
                   help="CIFAR-100: which label becomes y (CIFAR-10 has one)")


RECIPE = samples.recipe(
    "cifar", "a CIFAR-10/100 archive (binary or python version) -> train.h5, val.h5 (uint8 "
    "3x32x32, class names, channel mean/std)", _options,
    lambda args: Archive(args.archive, args.labels),
    lambda made, seed: cifar(made.archive, made.labels), lambda made: [made.archive])
