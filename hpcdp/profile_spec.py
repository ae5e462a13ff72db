"""What `run.profile` asks for: which steps to profile, on which ranks, in how much detail.

    run.profile = "steps=20-25"                  steps 20 to 25 on every rank
    run.profile = "steps=20-25 ranks=0,3"        on ranks 0 and 3 only
    run.profile = "steps=7 stacks shapes"        one step, with call stacks and input shapes

Parts are separated by spaces or `;`. Steps are counted as the log lines and
metrics.jsonl count them: step N is the N-th optimizer step of the run (from 1).
A trace's size grows with the steps it covers and the operators each step runs, so a
range is at most MAX_STEPS steps, and call stacks and input shapes (each several times
the size of a plain trace) are recorded only when named. Parsing is pure and needs no
PyTorch: every rank checks the same config before any collective (hpcdp.config).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

KEY = "run.profile"
#: The most steps one profile may cover. A trace grows with the operators each step runs:
#: about 85 KB a step for the tests' small CNN on a CPU (docs/profiling.md); a GPU step
#: records its kernels too, many more events.
MAX_STEPS = 10
FLAGS = ("shapes", "stacks")


class ProfileSpecError(ValueError):
    """`run.profile` does not parse; the message names the key and the bad part."""


@dataclass(frozen=True)
class ProfileSpec:
    first: int  # the first step profiled (as the logs count steps: from 1)
    last: int  # the last step profiled, inclusive
    ranks: tuple[int, ...] | None = None  # None: every rank
    shapes: bool = False  # torch.profiler's record_shapes
    stacks: bool = False  # torch.profiler's with_stack

    def covers(self, rank: int) -> bool:
        return self.ranks is None or rank in self.ranks


def parse(text: str) -> ProfileSpec | None:
    """`steps=20-25 ranks=0,1` -> ProfileSpec; '' -> None (no profile)."""
    parts = [p for p in re.split(r"[\s;]+", text.strip()) if p]
    if not parts:
        return None
    values: dict[str, str] = {}
    for part in parts:
        key, sep, value = part.partition("=")
        known = ("steps", "ranks") if sep else FLAGS
        if key not in known:
            raise _error(text, f"unknown part {part!r} (expected steps=A-B, ranks=R,R, "
                               f"{' or '.join(FLAGS)})")
        if key in values:
            raise _error(text, f"{key} is given twice")
        values[key] = value
    if "steps" not in values:
        raise _error(text, "no steps=A-B (the steps to profile, e.g. steps=20-25)")
    first, last = _steps(text, values["steps"])
    ranks = _ranks(text, values["ranks"]) if "ranks" in values else None
    return ProfileSpec(first, last, ranks, "shapes" in values, "stacks" in values)


def _steps(text: str, value: str) -> tuple[int, int]:
    match = re.fullmatch(r"(\d+)(?:-(\d+))?", value)
    if not match:
        raise _error(text, f"steps={value!r}: expected a step N or a range A-B of step numbers")
    first = int(match.group(1))
    last = int(match.group(2)) if match.group(2) is not None else first
    if first < 1 or last < first:
        raise _error(text, f"steps={value}: steps count from 1, and a range A-B needs A <= B")
    if last - first + 1 > MAX_STEPS:
        raise _error(text, f"steps={value} covers {last - first + 1} steps; at most "
                           f"{MAX_STEPS} (a trace's size grows with every step it covers)")
    return first, last


def _ranks(text: str, value: str) -> tuple[int, ...]:
    items = value.split(",")
    if not all(re.fullmatch(r"\d+", item) for item in items):
        raise _error(text, f"ranks={value!r}: expected rank numbers separated by commas")
    ranks = tuple(int(item) for item in items)
    if len(set(ranks)) != len(ranks):
        raise _error(text, f"ranks={value}: a rank is named twice")
    return ranks


def ranks_error(spec: ProfileSpec | None, size: int) -> str | None:
    """Why the spec's ranks do not fit a run of `size` ranks, or None."""
    if spec is None or spec.ranks is None or max(spec.ranks) < size:
        return None
    missing = [r for r in spec.ranks if r >= size]
    return (f"{KEY}: ranks {', '.join(map(str, missing))} are not in this run of {size} "
            f"rank(s) (0 to {size - 1})")


def _error(text: str, why: str) -> ProfileSpecError:
    return ProfileSpecError(f"{KEY}={text!r}: {why}")
