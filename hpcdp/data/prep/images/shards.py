"""WebDataset-style tar shards of images -> the same layout as an image folder (a scan; I/O
only to read the headers and the small label members).

A shard is an uncompressed tar whose members come in samples: members with the same
key (the member's name up to the first dot of its base name, folders included) form
one sample, e.g. ``0007.jpg`` + ``0007.cls``. A sample is an image member (a suffix of
`folder.EXTENSIONS`, any case) and a ``.cls`` member holding its class index as ASCII
digits; other members (``.json``, ``.txt``, ...) are skipped and counted.

Two layouts, as for folders: ``ROOT/*.tar`` with ``--val-fraction``, or
``ROOT/train/*.tar`` and ``ROOT/val/*.tar``. The classes are named by their index
(``"0"``, ``"1"``, ...) up to the largest training label; a class without training
images is an error. Samples are ordered as the folder ``ROOT/<label>/<image member's
base name>`` would order its files (class, then name; the same name in two shards by
shard order), then split and permuted by the folder's own rules, so shards and that
folder give the same file.

Members are found by their full name in the headers and read from their recorded
offset, a bounded number of bytes: an image over `MAX_IMAGE_BYTES` or a label over
`MAX_LABEL_BYTES` is an error naming the shard and member, before anything is decoded.
Links, devices and folders in a shard are skipped.
"""

from __future__ import annotations

import glob
import io
import os
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass, field

from hpcdp.data.prep.bounded import shown
from hpcdp.data.prep.images import folder
from hpcdp.data.prep.images.folder import FolderError, Layout

#: The largest image member read (a photo is far smaller; a bomb of bytes is refused).
MAX_IMAGE_BYTES = 64 << 20
#: The largest ``.cls`` member read: a class index in ASCII digits.
MAX_LABEL_BYTES = 32
#: Class indices at most this many: the names are "0".."N-1".
MAX_CLASSES = 1 << 20
LABEL_SUFFIX = ".cls"


@dataclass(frozen=True)
class Member:
    """One image in a shard: where its bytes are, its class index and size."""

    shard: str
    name: str
    label: int
    nbytes: int
    offset: int

    @property
    def path(self) -> str:
        """What messages name: the shard and the member."""
        return f"{self.shard}:{self.name}"

    def read(self) -> io.BytesIO:
        """The member's bytes (`nbytes`, at most `MAX_IMAGE_BYTES`)."""
        with open(self.shard, "rb") as fh:
            fh.seek(self.offset)
            data = fh.read(self.nbytes)
        if len(data) != self.nbytes:
            raise OSError(f"{self.path}: the shard ends inside the member")
        return io.BytesIO(data)


@dataclass
class _Sample:
    image: tarfile.TarInfo | None = None
    label: int | None = None


@dataclass
class _Skipped:
    hidden: int = 0
    other: int = 0
    examples: list[str] = field(default_factory=list)

    def skip(self, where: str) -> None:
        self.other += 1
        if len(self.examples) < 10:
            self.examples.append(where)


def is_shard_root(root: str) -> bool:
    """Whether `root` holds tar shards (``*.tar`` in it or in ``train/``)."""
    return bool(_shards(root) or _shards(os.path.join(root, "train")))


def _shards(where: str) -> list[str]:
    return sorted(p for p in glob.glob(os.path.join(glob.escape(where), "*.tar"))
                  if os.path.isfile(p))


def key_of(name: str) -> tuple[str, str]:
    """(key, suffix) of a member name: the suffix starts at the base name's first dot."""
    head, base = os.path.split(name)
    dot = base.find(".")
    if dot <= 0:
        return name, ""
    return os.path.join(head, base[:dot]), base[dot:].lower()


def _label(fh: tarfile.TarFile, info: tarfile.TarInfo, where: str) -> int:
    if info.size > MAX_LABEL_BYTES:
        raise FolderError(f"{where}: a label of {info.size} bytes (at most "
                          f"{MAX_LABEL_BYTES}: a class index in ASCII digits)")
    raw = fh.extractfile(info).read(MAX_LABEL_BYTES)  # type: ignore[union-attr]
    text = raw.decode("ascii", "replace").strip()
    if not text.isdigit() or not text.isascii() or int(text) >= MAX_CLASSES:
        raise FolderError(f"{where}: the label {text[:20]!r} is not a class index "
                          f"(0..{MAX_CLASSES - 1})")
    return int(text)


def _samples(shard: str, skipped: _Skipped) -> dict[str, _Sample]:
    """The samples of one shard by key, from its headers and label members."""
    samples: dict[str, _Sample] = {}
    try:
        with tarfile.open(shard, "r:") as fh:
            for info in fh:
                where = f"{shard}:{info.name}"
                key, suffix = key_of(info.name)
                if not info.isfile():
                    continue
                if os.path.basename(info.name).startswith("."):
                    skipped.hidden += 1
                    continue
                sample = samples.setdefault(key, _Sample())
                if suffix == LABEL_SUFFIX:
                    sample.label = _label(fh, info, where)
                elif suffix.endswith(folder.EXTENSIONS) and suffix.count(".") == 1:
                    if sample.image is not None:
                        raise FolderError(f"{where}: a second image for the sample "
                                          f"{key!r}")
                    if info.size > MAX_IMAGE_BYTES:
                        raise FolderError(f"{where}: {info.size} bytes, over the "
                                          f"{MAX_IMAGE_BYTES >> 20} MiB an image may have")
                    sample.image = info
                else:
                    skipped.skip(where)
    except (tarfile.TarError, OSError) as exc:
        raise FolderError(f"{shard}: not a readable tar shard: {exc}") from None
    return samples


def _members(shards: Sequence[str], skipped: _Skipped) -> list[tuple[str, int, Member]]:
    """Every image of `shards` with its sort name, in shard order."""
    out = []
    for s, shard in enumerate(shards):
        for key, sample in _samples(shard, skipped).items():
            if sample.image is None:
                if sample.label is not None:
                    raise FolderError(f"{shard}: the sample {key!r} has a label but no image")
                continue
            if sample.label is None:
                raise FolderError(f"{shard}:{sample.image.name}: no {key}{LABEL_SUFFIX} "
                                  "label member beside it")
            info = sample.image
            member = Member(shard, info.name, sample.label, info.size, info.offset_data)
            out.append((f"{os.path.basename(info.name)}\0{s:08d}", sample.label, member))
    return out


def _by_class(members: list[tuple[str, int, Member]]) -> dict[int, list[tuple[str, Member]]]:
    classes: dict[int, list[tuple[str, Member]]] = {}
    for name, label, member in members:
        classes.setdefault(label, []).append((name, member))
    return {c: sorted(found, key=lambda pair: pair[0]) for c, found in sorted(classes.items())}


def _check_classes(by_class: dict, where: str) -> list[str]:
    if not by_class:
        raise FolderError(f"{where}: no images with labels in the shards")
    n = max(by_class) + 1
    empty = [str(c) for c in range(n) if c not in by_class]
    if empty:
        raise FolderError(f"{where}: class(es) {', '.join(empty[:10])} have no training "
                          f"images (labels run 0..{n - 1})")
    return [str(c) for c in range(n)]


def _check_links(root: str, shards: Sequence[str], follow: bool) -> None:
    """A shard reached through a link leading outside `root` is refused unless `follow`,
    as a folder's files are (`folder.scan`)."""
    real = os.path.realpath(root)
    outside = [f"{shown(p)} -> {shown(os.path.realpath(p))}" for p in shards
               if os.path.commonpath([os.path.realpath(p), real]) != real]
    if outside and not follow:
        raise FolderError(folder.outside_message(root, outside))


def scan(root: str, val_fraction: float | None = None, seed: int = 0,
         follow_symlinks: bool = False) -> Layout:
    """The layout of the shards under `root`, as `folder.scan` gives for a folder."""
    presplit = bool(_shards(os.path.join(root, "train")))
    _check_links(root, [*_shards(root), *_shards(os.path.join(root, "train")),
                        *_shards(os.path.join(root, "val"))], follow_symlinks)
    if presplit and val_fraction:
        raise FolderError(f"--root {root} holds train/*.tar: its split is given, so "
                          "--val-fraction cannot apply")
    if val_fraction is not None and not 0.0 <= val_fraction < 1.0:
        raise FolderError(f"--val-fraction must be in [0, 1), got {val_fraction}")
    skipped = _Skipped()
    train_dir = os.path.join(root, "train") if presplit else root
    train = _by_class(_members(_shards(train_dir), skipped))
    classes = _check_classes(train, train_dir)
    splits: dict[str, list[Member]] = {"train": [], "val": []}
    if presplit:
        val = _by_class(_members(_shards(os.path.join(root, "val")), skipped))
        extra = [str(c) for c in val if c >= len(classes)]
        if extra:
            raise FolderError(f"{os.path.join(root, 'val')}: label(s) {', '.join(extra)} "
                              "have no training images")
        for c in range(len(classes)):
            splits["train"] += [m for _, m in train[c]]
            splits["val"] += [m for _, m in val.get(c, [])]
    else:
        for c in range(len(classes)):
            names = [n for n, _ in train[c]]
            lookup = dict(train[c])
            tr, va = folder.split_class(names, c, seed, val_fraction or 0.0)
            if not tr:
                raise FolderError(f"class {c}: all {len(names)} image(s) went to validation; "
                                  "lower --val-fraction")
            splits["train"] += [lookup[n] for n in tr]
            splits["val"] += [lookup[n] for n in va]
    ordered = {name: folder.output_order(entries, seed, name)  # type: ignore[arg-type]
               for name, entries in splits.items() if entries}
    return Layout(root, classes, ordered, skipped.hidden, skipped.other,  # type: ignore[arg-type]
                  skipped.examples)
