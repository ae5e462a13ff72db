"""Which files of an image folder are samples, their classes and their split (pure).

Two layouts:

- ``ROOT/train/<class>/*`` and ``ROOT/val/<class>/*``: the split is the folders';
- ``ROOT/<class>/*`` with a validation fraction: each class's files, in name
  order, are permuted by a generator seeded from (seed, class index) and the
  first ``round(n * fraction)`` go to validation, so the split depends only on
  the seed and the file names.

Classes are the sorted names of the class folders (of ``train/`` in the first
layout); a class's index is its position in that list. Files with the suffixes
in `EXTENSIONS` (any case) are samples; hidden files and folders (a leading dot)
and other suffixes are skipped and counted. Files are searched in the class folder
and below it (subfolders of a class belong to the class). The samples of a split
are written in a seeded permutation of (class, path) order, so that the
reader's block shuffle mixes classes even with large chunks.

Nothing outside ``--root`` is read unless asked: a symbolic link (a class folder,
a subfolder or a file) whose target lies outside the root is an error naming it,
unless `scan` is told to follow links (the recipe's ``--follow-symlinks``). Links
inside the root are followed; a folder reached a second time (a link to a class
or to a folder already read, a loop) is skipped and counted, as is a broken link.
A file with an image name that is not a regular file (a FIFO, a device) is kept
as a sample here and refused by `decode`, unopened, like any undecodable file.
Names are shown with non-UTF-8 bytes escaped (`bounded.shown`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from hpcdp.data.format.image_decode import EXTENSIONS
from hpcdp.data.prep.bounded import shown
from hpcdp.data.prep.world import PrepError

#: Links leading outside the root named in the error at most (the count is always given).
SHOW_OUTSIDE = 10


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
    root: str  # the real path of --root
    follow: bool  # follow links leading outside it
    hidden: int = 0
    other: int = 0
    examples: list[str] = field(default_factory=list)
    outside: list[str] = field(default_factory=list)  # links out of the root, not followed
    seen: set[str] = field(default_factory=set)  # real paths of the folders read (or to be)

    def skip(self, path: str, hidden: bool, why: str = "") -> None:
        if hidden:
            self.hidden += 1
        else:
            self.other += 1
        if len(self.examples) < 10:
            self.examples.append(shown(path) + (f" ({why})" if why else ""))

    def leaves_root(self, path: str, is_link: bool | None = None) -> bool:
        """Whether `path` is a link whose target lies outside the root (then recorded);
        `is_link` when known (a directory entry's type: no extra system call per file)."""
        if self.follow or not (os.path.islink(path) if is_link is None else is_link):
            return False
        target = os.path.realpath(path)
        if os.path.commonpath([target, self.root]) == self.root:
            return False
        self.outside.append(f"{shown(path)} -> {shown(target)}")
        return True


def is_image_name(name: str) -> bool:
    return not name.startswith(".") and name.lower().endswith(EXTENSIONS)


def _listing(folder: str) -> list[os.DirEntry]:
    try:
        with os.scandir(folder) as it:
            return sorted(it, key=lambda e: e.name)
    except OSError as exc:
        raise FolderError(f"{shown(folder)}: cannot be listed: {exc.strerror or exc}") from None


def _class_folders(folder: str, scan: _Scan) -> list[str]:
    """Sorted names of the visible subfolders of `folder` (links out of the root left out
    and recorded in `scan`)."""
    return [e.name for e in _listing(folder)
            if not e.name.startswith(".") and e.is_dir()
            and not scan.leaves_root(e.path, e.is_symlink())]


def _class_files(folder: str, scan: _Scan) -> list[str]:
    """The image files under one class folder, sorted by path; others counted in `scan`.
    Depth first with a stack, not recursion: a crafted nesting cannot exhaust Python's."""
    found: list[str] = []
    stack = [folder]
    while stack:
        below = []
        for e in _listing(stack.pop()):
            if e.name.startswith("."):
                scan.skip(e.path, True)
            elif scan.leaves_root(e.path, e.is_symlink()):
                continue
            elif e.is_symlink() and not os.path.exists(e.path):
                scan.skip(e.path, False, "a broken link")
            elif e.is_dir():
                real = os.path.realpath(e.path)
                if real in scan.seen:
                    scan.skip(e.path, False, "a folder read already: a class, a loop or a link")
                    continue
                scan.seen.add(real)
                below.append(e.path)
            elif is_image_name(e.name):
                found.append(e.path)
            else:
                scan.skip(e.path, False)
        stack += reversed(below)
    return sorted(found)


def _walk_classes(parent: str, classes: Sequence[str], scan: _Scan) -> list[list[str]]:
    """Each class folder's files; every class folder is claimed first, so that a link to
    one from inside another class is not read twice under two labels."""
    folders = [os.path.join(parent, c) for c in classes]
    scan.seen.update(os.path.realpath(f) for f in folders)
    return [_class_files(f, scan) for f in folders]


def _entries(paths: Sequence[str], label: int) -> list[Entry]:
    out = []
    for p in paths:
        try:
            out.append(Entry(p, label, os.path.getsize(p)))
        except OSError as exc:
            raise FolderError(f"{shown(p)}: cannot be read: {exc.strerror or exc}") from None
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


def scan(root: str, val_fraction: float | None = None, seed: int = 0,
         follow_symlinks: bool = False) -> Layout:
    """The layout under `root`; `FolderError` names an empty class, a class only in
    validation, a folder with no images, or links leading outside `root` (unless
    `follow_symlinks`)."""
    if not os.path.isdir(root):
        raise FolderError(f"--root {shown(root)}: not a folder")
    found = _Scan(os.path.realpath(root), follow_symlinks)
    presplit = "train" in [e.name for e in _listing(root) if e.is_dir()]
    if presplit and val_fraction:
        raise FolderError(f"--root {shown(root)} holds train/ (and val/): its split is given, so "
                          "--val-fraction cannot apply")
    if val_fraction is not None and not 0.0 <= val_fraction < 1.0:
        raise FolderError(f"--val-fraction must be in [0, 1), got {val_fraction}")
    if presplit:
        splits, classes = _scan_presplit(root, found)
    else:
        splits, classes = _scan_one(root, val_fraction or 0.0, seed, found)
    ordered = {name: output_order(entries, seed, name) for name, entries in splits.items()
               if entries}
    return Layout(root, classes, ordered, found.hidden, found.other, found.examples)


def outside_message(root: str, links: list[str]) -> str:
    shown_links = "\n  ".join(links[:SHOW_OUTSIDE])
    more = f"\n  ... and {len(links) - SHOW_OUTSIDE} more" if len(links) > SHOW_OUTSIDE else ""
    return (f"{len(links)} link(s) lead outside --root {shown(root)}:\n  {shown_links}{more}\n"
            "(pass --follow-symlinks to read them)")


def _check_outside(root: str, scan: _Scan) -> None:
    """`FolderError` listing the links out of the root, when the scan met any (checked
    before the classes, since such a link may leave a class empty)."""
    if scan.outside:
        raise FolderError(outside_message(root, scan.outside))


def _no_images(c: str, folder: str) -> FolderError:
    return FolderError(f"class {c!r}: {shown(folder)} holds no images ({', '.join(EXTENSIONS)})")


def _scan_presplit(root: str, found: _Scan) -> tuple[dict[str, list[Entry]], list[str]]:
    train_dir, val_dir = os.path.join(root, "train"), os.path.join(root, "val")
    for split_dir in (train_dir, val_dir):
        found.leaves_root(split_dir)
    _check_outside(root, found)
    classes = _class_folders(train_dir, found)
    val_classes = _class_folders(val_dir, found) if os.path.isdir(val_dir) else []
    _check_outside(root, found)
    if not classes:
        raise FolderError(f"{shown(train_dir)}: no class folders (expected "
                          "train/<class>/<images>)")
    index = {c: i for i, c in enumerate(classes)}
    only_val = [c for c in val_classes if c not in index]
    if only_val:
        raise FolderError(f"{shown(val_dir)}: class folder(s) {', '.join(map(repr, only_val))} "
                          f"have no training folder in {shown(train_dir)}")
    found.seen.update(os.path.realpath(os.path.join(val_dir, c)) for c in val_classes)
    train_files = _walk_classes(train_dir, classes, found)
    val_files = _walk_classes(val_dir, val_classes, found)
    _check_outside(root, found)
    splits: dict[str, list[Entry]] = {"train": [], "val": []}
    for name, folder, names, files in (("train", train_dir, classes, train_files),
                                       ("val", val_dir, val_classes, val_files)):
        for c, paths in zip(names, files):
            if not paths:
                raise _no_images(c, os.path.join(folder, c))
            splits[name] += _entries(paths, index[c])
    return splits, classes


def _scan_one(root: str, val_fraction: float, seed: int,
              found: _Scan) -> tuple[dict[str, list[Entry]], list[str]]:
    classes = _class_folders(root, found)
    _check_outside(root, found)
    if not classes:
        raise FolderError(f"--root {shown(root)}: no class folders (expected "
                          "<class>/<images>, or train/<class>/ and val/<class>/)")
    per_class = _walk_classes(root, classes, found)
    _check_outside(root, found)
    splits: dict[str, list[Entry]] = {"train": [], "val": []}
    for i, (c, files) in enumerate(zip(classes, per_class)):
        if not files:
            raise _no_images(c, os.path.join(root, c))
        train, val = split_class(files, i, seed, val_fraction)
        if not train:
            raise FolderError(f"class {c!r}: all {len(files)} image(s) went to validation; "
                              "lower --val-fraction")
        splits["train"] += _entries(train, i)
        splits["val"] += _entries(val, i)
    return splits, classes
