"""What trackers are given, and when (pure: no I/O, no tracker library).

A tracker cannot take back a point it was sent (MLflow has no call that deletes one
metric step), while a resumed run trains the steps after its checkpoint again. So a
record is held back until a checkpoint covers its step (`CommitBuffer.commit`), or the
run ends normally (`release_all`); what a stop or a crash leaves uncommitted is
dropped, and the resumed run sends those steps once, as it trains them again. What
was committed but never reached the tracker (the job died first, the tracker was
down) is sent on the resume, from metrics.jsonl (`catch_up`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Record:
    """One metrics.jsonl record: its kind (train, val), its step, its values and when it
    was written (seconds since the epoch)."""

    kind: str
    step: int
    values: Mapping[str, Any]
    time: float = 0.0


def flat_params(tree: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """{"optim": {"lr": 0.1}} -> {"optim.lr": "0.1"}: a config as a tracker's parameters.

    A table inside a section (model.kwargs) adds one more level; an empty one stays a
    parameter ("{}"), so that every key of the config is there. Strings as they are,
    everything else as JSON text (true, [0.9, 0.999]), as the config file would read.
    """
    out: dict[str, str] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flat_params(value, name + "."))
        else:
            out[name] = value if isinstance(value, str) else json.dumps(value)
    return out


def numbers(record: Record) -> dict[str, float]:
    """The record's numeric values as "kind/name" -> value (TensorBoard's names too)."""
    return {f"{record.kind}/{k}": float(v) for k, v in record.values.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)}


def scalars(summary: Mapping[str, Any]) -> dict[str, Any]:
    """A summary's top-level numbers and strings (a tracker's summary fields or tags)."""
    return {k: v for k, v in summary.items()
            if isinstance(v, (str, int, float)) and not (isinstance(v, float) and math.isnan(v))}


def parse_jsonl(lines: Iterable[str]) -> list[Record]:
    """metrics.jsonl lines as records; a line that is no record (a job killed mid-write
    leaves half of one) is skipped."""
    out = []
    for line in lines:
        try:
            data = json.loads(line)
            kind, step = data.pop("kind"), data.pop("step")
        except (ValueError, KeyError, AttributeError):
            continue
        if isinstance(kind, str) and isinstance(step, int):
            out.append(Record(kind, step, data, float(data.pop("time", 0.0) or 0.0)))
    return out


def catch_up(records: Iterable[Record], sent: Mapping[str, int], upto: int) -> list[Record]:
    """On a resume from the checkpoint of step `upto`: what metrics.jsonl holds up to it
    that the tracker run was never sent (committed but not yet sent when the job died,
    or the tracker was down). Each (kind, step) once, the first in the file."""
    buffer = CommitBuffer(sent)
    for r in records:
        buffer.add(r)
    return buffer.commit(upto)


class CommitBuffer:
    """Records held until a checkpoint covers their step.

    `sent`: per kind, the last step a tracker run was sent. One record of a kind per
    step, so a record at or below it is one the run already holds: sent before a
    resume from an older checkpoint, it is not sent a second time.
    """

    def __init__(self, sent: Mapping[str, int] | None = None) -> None:
        self.sent: dict[str, int] = dict(sent or {})
        self._held: list[Record] = []

    def add(self, record: Record) -> None:
        self._held.append(record)

    def commit(self, step: int) -> list[Record]:
        """The records up to `step`, now that a checkpoint of `step` is written, in order."""
        ready = [r for r in self._held if r.step <= step]
        self._held = [r for r in self._held if r.step > step]
        return self._release(ready)

    def release_all(self) -> list[Record]:
        """Everything held: the run has ended normally, nothing will be trained again."""
        ready, self._held = self._held, []
        return self._release(ready)

    def drop(self) -> int:
        """Forget what no checkpoint covers (a stop); returns how many records that was."""
        count, self._held = len(self._held), []
        return count

    def _release(self, ready: list[Record]) -> list[Record]:
        fresh = []
        for r in ready:
            if r.step > self.sent.get(r.kind, -1):
                fresh.append(r)
                self.sent[r.kind] = r.step
        return fresh
