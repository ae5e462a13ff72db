"""Each tracker's run, as the run folder remembers it: trackers/<name>.json.

{"run_id": ..., "sent": {"train": 120, "val": 100}}: the tracker's own run id, so that
a requeued or resumed job continues the same tracker run instead of starting a new
one, and the last step of each kind the run was sent (records.CommitBuffer). Written
whole or not at all (hpcdp.files), so a job killed mid-write leaves the last good one.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from hpcdp import files

FOLDER = "trackers"  # in the run folder: these files and the trackers' local stores


@dataclass
class TrackerState:
    run_id: str | None = None
    sent: dict[str, int] = field(default_factory=dict)


def path(run_dir: Path, name: str) -> Path:
    return run_dir / FOLDER / f"{name}.json"


def parse(text: str) -> TrackerState:
    """A state file's content; ValueError when it is not one (pure)."""
    data = json.loads(text)
    if not isinstance(data, dict) or not isinstance(data.get("run_id"), (str, type(None))):
        raise ValueError("expected {\"run_id\": ..., \"sent\": {...}}")
    sent = data.get("sent") or {}
    if not isinstance(sent, dict) or not all(isinstance(v, int) for v in sent.values()):
        raise ValueError("\"sent\" must map record kinds to steps")
    return TrackerState(data["run_id"], dict(sent))


def read(run_dir: Path, name: str) -> TrackerState:
    """The tracker's remembered run; a fresh state when there is none (or it is unreadable,
    which the caller hears of as ValueError or OSError)."""
    file = path(run_dir, name)
    if not file.exists():
        return TrackerState()
    return parse(file.read_text())


def write(run_dir: Path, name: str, run_id: str, sent: Mapping[str, int]) -> None:
    file = path(run_dir, name)
    file.parent.mkdir(parents=True, exist_ok=True)
    files.write_atomic(file, json.dumps({"run_id": run_id, "sent": dict(sent)}) + "\n")
