"""Counts as launchers write them into the environment: a positive whole number, and
Slurm's per-node lists ('2(x3),1').

The standard library alone, and no other hpcdp module: the thread plan reads a rank's
counts with it, and a container job's batch script carries this file's source with
hpcdp.cluster.layout's, for a host python3 that has no hpcdp (hpcdp.cluster.render).
"""

from __future__ import annotations


def positive_int(text: str | None) -> int | None:
    """`text` as a whole number above 0, else None (unset, empty, not a number)."""
    try:
        value = int(str(text).strip())
    except ValueError:
        return None
    return value if value > 0 else None


def slurm_tasks_per_node(text: str) -> list[int]:
    """Slurm's tasks-per-node list ('2(x3),1' -> [2, 2, 2, 1])."""
    counts: list[int] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        count, _, repeat = part.partition("(x")
        n, times = positive_int(count), positive_int(repeat.rstrip(")") or "1")
        if n is None or times is None:
            raise ValueError(f"cannot read Slurm's tasks per node {text!r}")
        counts += [n] * times
    return counts
