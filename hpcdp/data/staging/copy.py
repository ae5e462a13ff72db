"""Node-local data staging, the file-system part: check the stage dir, copy, record.

Decisions come from `hpcdp.data.staging.plan` (pure); no collectives here. A copy is
written to a hidden temporary name beside its final one, flushed to disk, re-read
for its BLAKE2b digest, then renamed into place; its sidecar follows the same way.
So a reader never sees half a file, and a copier killed mid-copy leaves at worst a
temporary file (removed by the next copier on that node) and no sidecar.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from hpcdp import files
from hpcdp.data.staging.plan import (
    SIDECAR_SUFFIX,
    FileOutcome,
    FileState,
    NodeResult,
    StageError,
    plan_node,
)

CHUNK = 8 << 20
_TMP = ".hpcdp-tmp-"


def check_dir(folder: str) -> None:
    """The stage dir exists (its parent must: a missing mount is not created) and is writable.

    Run on every rank before any collective, so a node without its local disk is
    named by every rank instead of hanging the others.
    """
    path = Path(folder)
    if not path.is_dir():
        if not path.parent.is_dir():
            raise StageError(f"stage dir {folder}: its parent {path.parent} does not exist "
                             "here (is the node-local disk mounted?)")
        try:
            path.mkdir(exist_ok=True)
        except OSError as e:
            raise StageError(f"stage dir {folder} cannot be created: {e.strerror}") from None
    probe = path / f"{_TMP}probe-{os.getpid()}"
    try:
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise StageError(f"stage dir {folder} is not writable: {e.strerror}") from None


def check_not_source(folder: str, data_root: str) -> None:
    """A copy onto its own source would delete the data it is about to read."""
    if os.path.realpath(folder) == os.path.realpath(data_root):
        raise StageError(f"data.stage_dir {folder} is data.path itself")


def check_sources(sources: Mapping[str, Path]) -> None:
    for role, path in sources.items():
        if not path.is_file():
            raise StageError(f"{role} file {path} does not exist (or is not a file)")


def sidecar(dest: Path) -> Path:
    return dest.with_name(dest.name + SIDECAR_SUFFIX)


def file_state(role: str, source: Path, dest: Path) -> FileState:
    st = source.stat()
    try:
        dst = dest.stat()
        dest_size, dest_mtime = dst.st_size, dst.st_mtime_ns
    except FileNotFoundError:
        dest_size = dest_mtime = None
    try:
        record = json.loads(sidecar(dest).read_text())
        record = record if isinstance(record, dict) else None
    except (OSError, ValueError):
        record = None
    return FileState(role, str(source), st.st_size, st.st_mtime_ns, str(dest), dest_size,
                     dest_mtime, record)


def digest_of(path: Path, drop_cache: bool = False) -> str:
    """BLAKE2b-512 of a file's bytes; `drop_cache`: read from the disk, not the page cache."""
    h = hashlib.blake2b()
    with path.open("rb") as f:
        if drop_cache and hasattr(os, "posix_fadvise"):
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def copy_file(state: FileState) -> FileOutcome:
    """Copy one file (temporary name, digest checked, rename), then write its sidecar."""
    source, dest = Path(state.source), Path(state.dest)
    sidecar(dest).unlink(missing_ok=True)  # first: a sidecar never vouches for a stale copy
    dest.unlink(missing_ok=True)  # frees its room before the new copy needs it
    dest.parent.mkdir(parents=True, exist_ok=True)
    remove_dead_temporaries(dest)
    t0 = time.perf_counter()
    h = hashlib.blake2b()
    with source.open("rb") as src, files.replacing(dest, mark=_TMP) as out:
        while chunk := src.read(CHUNK):
            h.update(chunk)
            out.write(chunk)
        out.flush()
        os.fsync(out.fileno())  # on the disk before the digest reads it back
        st = source.stat()
        if (st.st_size, st.st_mtime_ns) != (state.source_size, state.source_mtime_ns):
            raise StageError(f"{source} changed while it was being copied to {dest}")
        if digest_of(Path(out.name), drop_cache=True) != h.hexdigest():
            raise StageError(f"the copy of {source} at {dest} does not read back as written")
    write_sidecar(state, dest, h.hexdigest())
    return FileOutcome(state.role, str(dest), "copied", state.source_size,
                       time.perf_counter() - t0)


def write_sidecar(state: FileState, dest: Path, digest: str) -> None:
    st = dest.stat()
    record = {"source": state.source, "source_size": state.source_size,
              "source_mtime_ns": state.source_mtime_ns, "size": st.st_size,
              "mtime_ns": st.st_mtime_ns, "blake2b": digest}
    side = sidecar(dest)
    files.write_atomic(side, json.dumps(record, indent=1) + "\n")


def remove_dead_temporaries(dest: Path) -> None:
    """Temporary copies of `dest` left by a copier that no longer runs on this node."""
    for tmp in dest.parent.glob(f".{dest.name}{_TMP}*"):
        pid = tmp.name.rsplit(_TMP, 1)[1]
        if pid.isdigit() and not _alive(int(pid)):
            tmp.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stage_node(node: str, stage_dir: str, data_root: str, names: Mapping[str, str],
               free_bytes: Callable[[str], int] | None = None) -> NodeResult:
    """The copier's work on one node: copy what is missing or stale, keep identical copies,
    or (too little room) read every file in place with a warning in the result.

    `names`: {role: file name inside data.path}; `free_bytes(folder)` defaults to
    shutil.disk_usage (tests pass their own to play a full disk).
    """
    free = free_bytes or (lambda folder: shutil.disk_usage(folder).free)
    states = [file_state(role, Path(data_root) / name, Path(stage_dir) / name)
              for role, name in names.items()]
    plan = plan_node(states, free(stage_dir))
    if plan.in_place:
        files = tuple(FileOutcome(s.role, s.source, "in place") for s in states)
        return NodeResult(node, stage_dir, data_root, files,
                          f"data staging on {node}: {stage_dir} is too small ({plan.reason}); "
                          f"reading {data_root} in place")
    outcomes = {s.role: FileOutcome(s.role, s.dest, "kept") for s in plan.keep}
    for state in plan.copy:
        outcomes[state.role] = copy_file(state)
    return NodeResult(node, stage_dir, stage_dir, tuple(outcomes[r] for r in names))
