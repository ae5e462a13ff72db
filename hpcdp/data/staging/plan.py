"""Node-local data staging, the pure part: where the copy goes and what to do with it.

`data.stage_dir` names a folder on each node (``$TMPDIR/hpcdp``, ``/nvme/${SLURM_JOB_ID}``);
its variables expand in each node's own environment. One rank per node (the lowest
rank there) copies the training and validation files from `data.path` into it; the
readers then open the copy. Everything here decides from plain values: the copying
itself is `hpcdp.data.staging.copy`, the ranks' agreement `hpcdp.data.staging.collective`.

A copy is *identical* (kept, not read again) when its sidecar
``<file>.hpcdp-stage.json``, written after the copy was renamed into place, names the
same source path, size and modification time (ns) as the source has now, and the copy
itself still has the size and modification time the sidecar recorded. The sidecar
also holds the copy's BLAKE2b-512 digest (what ``b2sum`` prints), checked against a
re-read of the copy when it was made.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

SIDECAR_SUFFIX = ".hpcdp-stage.json"
#: Room left free on the stage disk beyond the files themselves (other users, logs).
HEADROOM_BYTES = 64 << 20
_VAR = re.compile(r"\$(?:\{([^}]*)\}|([A-Za-z_][A-Za-z0-9_]*))")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


class StageError(ValueError):
    """The stage dir cannot be used on this node, or a copy failed."""


def expand(template: str, environ: Mapping[str, str]) -> str:
    """`$NAME` and `${NAME}` in data.stage_dir replaced from this node's environment.

    An unset variable is an error, never an empty string: ``$TMPDIR/x`` must not
    quietly become ``/x`` on a node whose TMPDIR is unset.
    """

    def value(m: re.Match[str]) -> str:
        name = m[1] if m[1] is not None else m[2]
        if not _NAME.match(name):
            raise StageError(f"data.stage_dir={template!r}: ${{{name}}} is not a variable name")
        if name not in environ:
            raise StageError(f"data.stage_dir={template!r}: environment variable {name} is "
                             "not set")
        return environ[name]

    expanded = _VAR.sub(value, template)
    if not os.path.isabs(expanded):
        raise StageError(f"data.stage_dir={template!r} expands to {expanded!r}, not an "
                         "absolute path")
    return expanded


@dataclass(frozen=True)
class FileState:
    """One file as the copier found it: the source, its copy (if any) and the sidecar."""

    role: str  # "train" | "val"
    source: str
    source_size: int
    source_mtime_ns: int
    dest: str
    dest_size: int | None = None  # None: no copy there
    dest_mtime_ns: int | None = None
    record: Mapping[str, Any] | None = None  # the sidecar's content, if it parsed


def identical(state: FileState) -> bool:
    """Whether the copy there is the source's, by the sidecar (no byte is read)."""
    rec = state.record
    if rec is None or state.dest_size is None:
        return False
    return (rec.get("source") == state.source and rec.get("source_size") == state.source_size
            and rec.get("source_mtime_ns") == state.source_mtime_ns
            and rec.get("size") == state.dest_size == state.source_size
            and rec.get("mtime_ns") == state.dest_mtime_ns)


@dataclass(frozen=True)
class NodePlan:
    """What one node's copier does: copy some files, keep the rest, or read in place."""

    copy: tuple[FileState, ...]
    keep: tuple[FileState, ...]
    in_place: bool  # True: not enough room; every file is read from the shared path
    needed: int  # bytes the copies need, headroom included
    available: int  # free bytes, plus those of stale copies that would be removed
    reason: str = ""


def plan_node(states: Sequence[FileState], free_bytes: int) -> NodePlan:
    """Copy what is not identical if it fits (with HEADROOM_BYTES), else read in place.

    All or nothing: the readers open both files from one folder, so a node whose
    disk holds only one of them reads both from the shared path.
    """
    copy = tuple(s for s in states if not identical(s))
    keep = tuple(s for s in states if identical(s))
    if not copy:
        return NodePlan(copy, keep, False, 0, free_bytes)
    needed = sum(s.source_size for s in copy) + HEADROOM_BYTES
    available = free_bytes + sum(s.dest_size or 0 for s in copy)  # stale copies go first
    if needed <= available:
        return NodePlan(copy, keep, False, needed, available)
    reason = (f"needs {format_bytes(needed)} ({format_bytes(needed - HEADROOM_BYTES)} of data "
              f"+ {format_bytes(HEADROOM_BYTES)} headroom), {format_bytes(available)} free")
    return NodePlan(copy, keep, True, needed, available, reason)


def format_bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


@dataclass(frozen=True)
class FileOutcome:
    role: str
    path: str  # the file the readers open
    action: str  # "copied" | "kept" (identical copy there) | "in place"
    bytes_copied: int = 0
    seconds: float = 0.0


@dataclass(frozen=True)
class NodeResult:
    """What staging did on one node: sent to every rank, recorded by rank 0."""

    node: str
    stage_dir: str
    read_root: str  # the folder the node's readers open (stage dir, or data.path)
    files: tuple[FileOutcome, ...] = field(default_factory=tuple)
    warning: str = ""  # why the node reads in place, if it does

    def describe(self) -> str:
        words = {"kept": "kept (identical copy there)", "in place": "read in place"}
        parts = [f"{f.role} copied ({format_bytes(f.bytes_copied)} in {f.seconds:.1f} s)"
                 if f.action == "copied" else f"{f.role} {words.get(f.action, f.action)}"
                 for f in self.files]
        return f"data staging on {self.node}: {', '.join(parts)}; reading {self.read_root}"


def copier_ranks(nodes: Sequence[str]) -> dict[str, int]:
    """{node: its lowest rank}: the one rank per node that copies (nodes[r] is rank r's)."""
    first: dict[str, int] = {}
    for rank, node in enumerate(nodes):
        first.setdefault(node, rank)
    return first


def node_errors(nodes: Sequence[str], dirs: Sequence[str | None],
                errors: Sequence[str | None]) -> str | None:
    """Every rank's local error, or ranks of one node that expanded different stage dirs."""
    bad = [f"rank {r} on {nodes[r]}: {e}" for r, e in enumerate(errors) if e]
    if bad:
        return "data staging: " + "; ".join(bad)
    seen: dict[str, tuple[int, str | None]] = {}
    for rank, (node, folder) in enumerate(zip(nodes, dirs, strict=True)):
        first = seen.setdefault(node, (rank, folder))
        if first[1] != folder:
            return (f"data staging: ranks {first[0]} and {rank} on {node} expanded "
                    f"data.stage_dir to different folders ({first[1]!r}, {folder!r}); one "
                    "node shares one copy, so the path may name the node or job, not the rank")
    return None


def copy_errors(results: Sequence[NodeResult | str | None]) -> str | None:
    """The copiers' failures (a str in place of a result), or None."""
    bad = [r for r in results if isinstance(r, str)]
    return "data staging failed: " + "; ".join(bad) if bad else None
