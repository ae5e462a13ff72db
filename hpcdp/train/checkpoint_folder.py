"""The folder of checkpoints: numbered files, the newest that verifies, keep-k.

A run's checkpoints are `step-NNNNNNNN.pt` files in one folder (temporary names are
ignored). `find_latest` returns the newest whose checksum verifies: a bad one (a
crash mid-copy, a bad disk) is skipped with a warning and the next newest is used,
while a folder or file that others could have written is refused
(hpcdp.train.checkpoint_trust). `prune` keeps the newest `checkpoint.keep`; a file
that fails the format's checks can be set aside as `*.corrupt`. No collectives.
"""

from __future__ import annotations

import os
import re
import warnings
from dataclasses import dataclass
from pathlib import Path

from hpcdp.train.checkpoint_format import CheckpointError, verify
from hpcdp.train.checkpoint_trust import Trust, UntrustedError, check_trusted, read_checked

NAME_RE = re.compile(r"^step-(\d+)\.pt$")


def step_path(folder: Path, step: int) -> Path:
    return folder / f"step-{step:08d}.pt"


def list_checkpoints(folder: Path) -> list[tuple[int, Path]]:
    """(step, path) of every checkpoint file in `folder`, newest first; temp files ignored."""
    if not folder.is_dir():
        return []
    found = []
    for p in folder.iterdir():
        m = NAME_RE.match(p.name)
        if m and p.is_file():
            found.append((int(m.group(1)), p))
    return sorted(found, reverse=True)


# --------------------------------------------------------------------------- finding one


@dataclass
class Found:
    """A verified checkpoint: where it is and its exact bytes (ready to broadcast)."""

    path: Path
    step: int
    data: bytes


def find_latest(folder: Path, trust: Trust = Trust()) -> Found | None:
    """The newest checkpoint in `folder` whose checksum verifies; warn about each bad one.

    A folder or file that others could have written is refused (UntrustedError),
    not skipped: someone should look at it before anything resumes.
    """
    if folder.is_dir():
        check_trusted(folder.resolve(), trust)
    for step, path in list_checkpoints(folder):
        try:
            return Found(path, step, read_checked(path, str(path), trust))
        except UntrustedError:
            raise
        except CheckpointError as e:
            warnings.warn(f"skipping checkpoint: {e}", stacklevel=2)
    return None


def is_corrupt(path: Path) -> bool:
    """Whether the file's bytes fail the format's checks (not: whether it can be read)."""
    try:
        data = path.read_bytes()
    except OSError:
        return False
    try:
        verify(data, str(path))
    except CheckpointError:
        return True
    return False


def set_aside(path: Path) -> Path:
    """Rename a bad checkpoint to `<name>.corrupt`: kept for inspection, no longer listed."""
    target = path.with_name(path.name + ".corrupt")
    os.replace(path, target)
    return target


def prune(folder: Path, keep: int) -> list[Path]:
    """Delete all but the newest `keep` checkpoint files; return what was removed."""
    removed = []
    for _, path in list_checkpoints(folder)[keep:]:
        path.unlink(missing_ok=True)
        removed.append(path)
    return removed
