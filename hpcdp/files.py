"""Whole files or none: write under a temporary name beside the target, then rename.

A reader (another rank, a resumed job, a batch system, a person) finds the old file
or the new one, never half of either: os.replace is atomic within one folder, and
a write that fails leaves the old file as it was. Standard library only, so that
every layer (runtime, data, train, cluster, bench) may import it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

#: What marks a temporary name: `.<name><TMP_MARK><pid>` beside the target.
TMP_MARK = ".tmp-"


def temporary_name(path: Path, mark: str = TMP_MARK) -> Path:
    """This process's temporary name for `path`, hidden and in the same folder."""
    return path.with_name(f".{path.name}{mark}{os.getpid()}")


@contextmanager
def replacing(path: str | os.PathLike[str], *, fsync: bool = False,
              mark: str = TMP_MARK) -> Iterator[BinaryIO]:
    """A new file opened for writing under a temporary name; renamed over `path` when
    the block ends, removed (and `path` left as it was) when the block raises.

    fsync: the bytes reach the disk before the rename (call `sync_folder` after it
    for the rename itself to survive a crash of the machine). A stale temporary of
    the same name is removed, not reused with whatever mode it had; the new file
    gets the user's umask. `mark` names the temporary (see `temporary_name`).
    """
    target = Path(path)
    tmp = temporary_name(target, mark)
    tmp.unlink(missing_ok=True)
    try:
        with open(str(tmp), "xb") as f:
            yield f
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def write_atomic(path: str | os.PathLike[str], data: bytes | str, *,
                 durable: bool = False) -> Path:
    """`data` (text is written as UTF-8, newlines as given) as the whole of `path`.

    durable: fsync the file before the rename and its folder after, so that the
    new file survives a crash of the machine (checkpoints); else the page cache
    decides when it reaches the disk, which is enough for what a crash may lose.
    """
    target = Path(path)
    with replacing(target, fsync=durable) as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)
    if durable:
        sync_folder(target.parent)
    return target


def sync_folder(folder: str | os.PathLike[str]) -> None:
    """fsync a folder, so that a rename in it survives a crash of the machine."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
