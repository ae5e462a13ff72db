"""Which files of an image folder are samples, their classes and their split (pure).

Two layouts:

- ``ROOT/train/<class>/*`` and ``ROOT/val/<class>/*``: the split is the folders';
- ``ROOT/<class>/*`` with a validation fraction: each class's files, in name
  order, are permuted by a generator seeded from (seed, class index) and the
  first ``round(n * fraction)`` go to validation, so the split depends only on
  the seed and the file names.

Classes are the sorted names of the class folders (of ``train/`` in the first
layout); a class's index is its position in that list. Files with the suffixes
in `EXTENSIONS` (any case) are samples; hidden files (a leading dot) and other
suffixes are skipped and counted. Files are searched in the class folder and
below it (subfolders of a class belong to the class). The samples of a split
are written in a seeded permutation of (class, path) order, so that the
reader's block shuffle mixes classes even with large chunks.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from hpcdp.data.prep.frame import PrepError

EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp")


class FolderError(PrepError):
    """A layout that cannot be prepared; the message names the folder or class."""


@dataclass(frozen=True)
class Entry:
    """One image file: its path, class index and size in bytes (for the byte split)."""

    path: str
    label: int
    nbytes: int


@dataclass
class Layout:
    """The classes, each split's files in output order, and what the scan skipped."""

    root: str
    classes: list[str]
    splits: dict[str, list[Entry]]
    skipped_hidden: int = 0
    skipped_other: int = 0
    skipped_examples: list[str] = field(default_factory=list)


@dataclass
class _Scan:
    hidden: int = 0
    other: int = 0
    examples: list[str] = field(default_factory=list)

    def skip(self, path: str, hidden: bool) -> None:
        if hidden:
            self.hidden += 1
        else:
            self.other += 1
        if len(self.examples) < 10:
            self.examples.append(path)


def is_image_name(name: str) -> bool:
    return not name.startswith(".") and name.lower().endswith(EXTENSIONS)


def _class_folders(folder: str) -> list[str]:
    """Sorted names of the visible subfolders of `folder`."""
    try:
        names = os.listdir(folder)
    except OSError as exc:
        raise FolderError(f"{folder}: cannot be listed: {exc.strerror or exc}") from None
    return sorted(n for n in names
                  if not n.startswith(".") and os.path.isdir(os.path.join(folder, n)))


def _class_files(folder: str, scan: _Scan) -> list[str]:
    """The image files under one class folder, sorted by path; others counted in `scan`."""
    found: list[str] = []
    for here, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            path = os.path.join(here, name)
            if is_image_name(name):
                found.append(path)
            else:
                scan.skip(path, name.startswith("."))
    return sorted(found)


def _entries(paths: Sequence[str], label: int) -> list[Entry]:
    out = []
    for p in paths:
        try:
            out.append(Entry(p, label, os.path.getsize(p)))
        except OSError as exc:
            raise FolderError(f"{p}: cannot be read: {exc.strerror or exc}") from None
    return out


def output_order(entries: list[Entry], seed: int, split: str) -> list[Entry]:
    """`entries` (in class, path order) in a permutation seeded from (seed, split)."""
    key = [seed, 0 if split == "train" else 1]
    perm = np.random.Generator(np.random.PCG64(np.random.SeedSequence(key))).permutation(
        len(entries))
    return [entries[i] for i in perm]


def split_class(paths: Sequence[str], class_index: int, seed: int,
                val_fraction: float) -> tuple[list[str], list[str]]:
    """(train, val) of one class's sorted files: a seeded permutation, the first
    ``round(n * val_fraction)`` to validation; each part back in name order."""
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, class_index, 7])))
    perm = rng.permutation(len(paths))
    n_val = round(len(paths) * val_fraction)
    val = sorted(paths[i] for i in perm[:n_val])
    train = sorted(paths[i] for i in perm[n_val:])
    return train, val


def scan(root: str, val_fraction: float | None = None, seed: int = 0) -> Layout:
    """The layout under `root`; `FolderError` names an empty class, a class only in
    validation, or a folder with no images."""
    if not os.path.isdir(root):
        raise FolderError(f"--root {root}: not a folder")
    top = _class_folders(root)
    presplit = "train" in top
    if presplit and val_fraction:
        raise FolderError(f"--root {root} holds train/ (and val/): its split is given, so "
                          "--val-fraction cannot apply")
    if val_fraction is not None and not 0.0 <= val_fraction < 1.0:
        raise FolderError(f"--val-fraction must be in [0, 1), got {val_fraction}")
    found = _Scan()
    if presplit:
        splits, classes = _scan_presplit(root, found)
    else:
        splits, classes = _scan_one(root, val_fraction or 0.0, seed, found)
    ordered = {name: output_order(entries, seed, name) for name, entries in splits.items()
               if entries}
    return Layout(root, classes, ordered, found.hidden, found.other, found.examples)


def _scan_presplit(root: str, found: _Scan) -> tuple[dict[str, list[Entry]], list[str]]:
    train_dir, val_dir = os.path.join(root, "train"), os.path.join(root, "val")
    classes = _class_folders(train_dir)
    if not classes:
        raise FolderError(f"{train_dir}: no class folders (expected train/<class>/<images>)")
    index = {c: i for i, c in enumerate(classes)}
    splits: dict[str, list[Entry]] = {"train": [], "val": []}
    for c in classes:
        files = _class_files(os.path.join(train_dir, c), found)
        if not files:
            raise FolderError(f"class {c!r}: {os.path.join(train_dir, c)} holds no images "
                              f"({', '.join(EXTENSIONS)})")
        splits["train"] += _entries(files, index[c])
    if os.path.isdir(val_dir):
        val_classes = _class_folders(val_dir)
        only_val = [c for c in val_classes if c not in index]
        if only_val:
            raise FolderError(f"{val_dir}: class folder(s) {', '.join(map(repr, only_val))} "
                              f"have no training folder in {train_dir}")
        for c in val_classes:
            files = _class_files(os.path.join(val_dir, c), found)
            if not files:
                raise FolderError(f"class {c!r}: {os.path.join(val_dir, c)} holds no images")
            splits["val"] += _entries(files, index[c])
    return splits, classes


def _scan_one(root: str, val_fraction: float, seed: int,
              found: _Scan) -> tuple[dict[str, list[Entry]], list[str]]:
    classes = _class_folders(root)
    if not classes:
        raise FolderError(f"--root {root}: no class folders (expected <class>/<images>, or "
                          "train/<class>/ and val/<class>/)")
    splits: dict[str, list[Entry]] = {"train": [], "val": []}
    for i, c in enumerate(classes):
        files = _class_files(os.path.join(root, c), found)
        if not files:
            raise FolderError(f"class {c!r}: {os.path.join(root, c)} holds no images "
                              f"({', '.join(EXTENSIONS)})")
        train, val = split_class(files, i, seed, val_fraction)
        if not train:
            raise FolderError(f"class {c!r}: all {len(files)} image(s) went to validation; "
                              "lower --val-fraction")
        splits["train"] += _entries(train, i)
        splits["val"] += _entries(val, i)
    return splits, classes


def byte_ranges(nbytes: Sequence[int], size: int) -> list[tuple[int, int]]:
    """Each rank's contiguous range of files ``[lo, hi)``, cut where the running total of
    bytes crosses ``r * total / size``: about equal bytes to decode per rank."""
    ends = np.cumsum(np.asarray(nbytes, dtype=np.int64))
    total = int(ends[-1]) if len(ends) else 0
    starts = ends - np.asarray(nbytes, dtype=np.int64)
    # File i goes to the rank whose share holds its first byte.
    owner = (starts * size // max(1, total)).astype(np.int64) if total else np.zeros(
        len(nbytes), np.int64)
    cuts = np.searchsorted(owner, np.arange(size + 1), side="left")
    cuts[-1] = len(nbytes)
    return [(int(cuts[r]), int(cuts[r + 1])) for r in range(size)]
