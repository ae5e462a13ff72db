"""Where each rank's time went over a run, from its metrics.jsonl records (pure).

Every train record carries each rank's seconds of its window per phase
(`ranks_<phase>_s`, hpcdp.train.reporting.RANK_PHASES). Summed over the run's
records they give one row per rank: what `hpcdp report` draws. A rank's *own* time
is every phase but `comm`: all ranks take the same wall time per step (each waits in
the gradients' all-reduce for the slowest), so the waits and the own time together
are alike on every rank, and a straggler shows as the most own time and the least
waiting (docs/stalls.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from hpcdp.train.reporting import RANK_PHASES

#: The phases that are a rank's own work, bottom to top of its bar.
OWN_PHASES = ("data", "compute", "optimizer", "checkpoint", "other")
WAIT_PHASE = "comm"


@dataclass(frozen=True)
class RankTimes:
    """Seconds per phase (RANK_PHASES) for each rank, over the records read."""

    seconds: dict[str, list[float]]  # phase -> one total per rank, in rank order
    steps: int  # the last step the records reach
    records: int  # how many train records carried per-rank times

    @property
    def ranks(self) -> int:
        return len(self.seconds[RANK_PHASES[0]])

    def own(self) -> list[float]:
        """Each rank's own seconds (all but its waits in collectives)."""
        return [sum(self.seconds[p][r] for p in OWN_PHASES) for r in range(self.ranks)]

    def slowest(self) -> int:
        own = self.own()
        return max(range(len(own)), key=own.__getitem__)


def rank_times(records: Iterable[Mapping[str, Any]]) -> RankTimes:
    """Sum the per-rank phase seconds of every train record; ValueError when none has them."""
    totals: dict[str, list[float]] | None = None
    steps = count = 0
    for rec in records:
        if rec.get("kind") != "train" or f"ranks_{RANK_PHASES[0]}_s" not in rec:
            continue
        rows = {p: [float(v) for v in rec[f"ranks_{p}_s"]] for p in RANK_PHASES}
        if totals is None:
            totals = {p: [0.0] * len(rows[p]) for p in RANK_PHASES}
        if any(len(rows[p]) != len(totals[p]) for p in RANK_PHASES):
            raise ValueError(f"the train record of step {rec.get('step')} has per-rank times "
                             f"of {len(rows[RANK_PHASES[0]])} ranks, earlier ones of "
                             f"{len(totals[RANK_PHASES[0]])}: a run resumed on another "
                             "number of ranks")
        for p in RANK_PHASES:
            totals[p] = [a + b for a, b in zip(totals[p], rows[p])]
        steps, count = max(steps, int(rec.get("step", 0))), count + 1
    if totals is None:
        raise ValueError("no train record with per-rank times (ranks_*_s): the run logged "
                         "nothing yet, or it was trained by an hpcdp that did not record them")
    return RankTimes(totals, steps, count)
