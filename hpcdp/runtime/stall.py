"""Stalls, as pure rules: how long a rank may go without progress, and who is behind.

The watchdog (hpcdp.runtime.watchdog) measures and acts; this module only decides, so that
the rule and the message are testable without threads, files or MPI.

The bound. Time is cut into intervals that end at a step boundary or when a long
section (validation, checkpoint) begins; each interval has a kind: `start` (init to
the first step), `step`, `validation` or `checkpoint`. With `run.step_timeout_s`
negative (the default) the bound of an interval of a kind already measured is the
larger of `run.stall_floor_s` and `run.stall_multiple` times the slowest interval
of that kind seen so far; a kind not measured yet (the start, the first step, the
first validation, the first checkpoint) gets `run.stall_warmup_factor` times the
floor. A positive `run.step_timeout_s` is a fixed bound (the start still gets the
warm-up factor); 0 turns the watchdog off.

Who is behind. Each rank records its step, how many collectives it entered in that
step, and its phase. A rank with a lower (step, collectives) pair than another has
not reached the point the other waits at: the ranks with the lowest pair are the
laggards; when every rank has the same pair, no single rank is behind.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

START, STEP, VALIDATION, CHECKPOINT = "start", "step", "validation", "checkpoint"
KINDS = (START, STEP, VALIDATION, CHECKPOINT)
PREFIX = "hpcdp stall:"  # the first word of every stall report line


@dataclass(frozen=True)
class StallRule:
    """The run.* keys that set the bound (see the module docstring)."""

    timeout_s: float = -1.0  # negative: auto; 0: off; positive: fixed
    floor_s: float = 300.0
    multiple: float = 10.0
    warmup_factor: float = 3.0

    @property
    def enabled(self) -> bool:
        return self.timeout_s != 0

    def describe(self) -> str:
        if self.timeout_s > 0:
            return f"run.step_timeout_s={self.timeout_s:g}"
        return (f"auto: max(run.stall_floor_s={self.floor_s:g}, run.stall_multiple="
                f"{self.multiple:g} x slowest seen); first of a kind "
                f"{self.warmup_factor:g} x floor")


def bound_s(rule: StallRule, kind: str, slowest: Mapping[str, float]) -> float:
    """Seconds an interval of `kind` may last, given the slowest of each kind seen; 0: off."""
    if not rule.enabled:
        return 0.0
    if rule.timeout_s > 0:
        return rule.timeout_s * (rule.warmup_factor if kind == START else 1.0)
    if kind == START or kind not in slowest:
        return rule.warmup_factor * rule.floor_s
    return max(rule.floor_s, rule.multiple * slowest[kind])


@dataclass(frozen=True)
class Beat:
    """One rank's heartbeat: where it is and when it last said so."""

    step: int
    entered: int  # collectives entered in this step
    time: float  # Unix time of the record
    stalled: bool  # this rank's watchdog has fired
    host: str
    pid: int
    phase: str

    @property
    def position(self) -> tuple[int, int]:
        return self.step, self.entered


RECORD_BYTES = 256  # every record is padded to this, so a rewrite in place never leaves a tail


def format_beat(beat: Beat) -> bytes:
    """The fixed-width text of a heartbeat file (one line, space-separated, phase last)."""
    host = beat.host.replace(" ", "_") or "?"
    line = (f"{beat.step} {beat.entered} {beat.time:.3f} {int(beat.stalled)} {host} "
            f"{beat.pid} {beat.phase}")
    data = line.encode("utf-8", "replace")[:RECORD_BYTES - 1]
    return data.ljust(RECORD_BYTES - 1) + b"\n"


def parse_beat(data: bytes) -> Beat | None:
    """A heartbeat file's bytes -> Beat, or None when empty, torn or foreign."""
    parts = data.decode("utf-8", "replace").strip().split(" ", 6)
    if len(parts) != 7:
        return None
    try:
        return Beat(int(parts[0]), int(parts[1]), float(parts[2]), parts[3] == "1", parts[4],
                    int(parts[5]), parts[6])
    except ValueError:
        return None


def rank_list(ranks: Sequence[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0-2,5,7-8' (compact, for jobs of thousands of ranks)."""
    out: list[str] = []
    ordered = sorted(ranks)
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        out.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(out)


def _by_phase(beats: Mapping[int, Beat], now: float) -> str:
    """'data: rank 1 (host a, silent 12 s); allreduce gradients: ranks 0,2-3'."""
    groups: dict[str, list[int]] = {}
    for rank, beat in beats.items():
        groups.setdefault(f"step {beat.step}, {beat.phase}", []).append(rank)
    parts = []
    for where, ranks in sorted(groups.items(), key=lambda kv: min(kv[1])):
        who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {rank_list(ranks)}"
        if len(ranks) == 1:
            beat = beats[ranks[0]]
            silent = now - beat.time
            note = f", silent {silent:.0f} s" if silent > 5 else ""
            who += f" ({beat.host} pid {beat.pid}{note})"
        parts.append(f"{who} in {where}")
    return "; ".join(parts)


def laggards(beats: Mapping[int, Beat]) -> list[int]:
    """The ranks behind the others (lowest step and collective count), or [] if none is."""
    if not beats:
        return []
    low = min(b.position for b in beats.values())
    high = max(b.position for b in beats.values())
    if low == high:
        return []
    return sorted(r for r, b in beats.items() if b.position == low)


def report(beats: Mapping[int, Beat], size: int, now: float) -> str:
    """What every rank was doing, laggards first (the text after PREFIX)."""
    missing = [r for r in range(size) if r not in beats]
    behind = laggards(beats)
    if behind:
        lead = {r: beats[r] for r in behind}
        rest = {r: b for r, b in beats.items() if r not in lead}
        noun = "rank" if len(behind) == 1 else "ranks"
        text = (f"{noun} {rank_list(behind)} did not reach the point the others wait at: "
                f"{_by_phase(lead, now)}; the others: {_by_phase(rest, now)}")
    elif beats:
        text = f"no rank is behind the others: {_by_phase(beats, now)}"
    else:
        text = "no heartbeat of any rank could be read"
    if missing:
        text += (f"; no heartbeat from {'rank' if len(missing) == 1 else 'ranks'} "
                 f"{rank_list(missing)} (dead, hung before its first heartbeat, or the run "
                 "folder is not shared between nodes)")
    return text


def reporters(size: int) -> set[int] | None:
    """The ranks that read every heartbeat on a stall: all (None) in small jobs, else four.

    Every rank reading every rank's file is size**2 reads on a shared file system.
    """
    if size <= 32:
        return None
    return {0, size // 3, 2 * size // 3, size - 1}
