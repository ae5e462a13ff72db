"""Metric sums over batches and ranks, and validation over every sample once.

A task's metrics reduce over ranks by mean, sum or gather (hpcdp.tasks.Metric).
Sums stay on the device between reports (no sync per step); a report is one
all-reduce of all sums, plus one gather per gathered metric.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from hpcdp.runtime import dist, watchdog
from hpcdp.tasks import Metric
from hpcdp.train.accel import to_layout
from hpcdp.train.numerics import autocast


class MetricSums:
    """Running sums of a task's metrics on one rank, reduced over ranks on demand."""

    def __init__(self, metrics: Sequence[Metric], device: torch.device,
                 training: bool = False) -> None:
        self.metrics = [m for m in metrics
                        if (m.in_training if training else m.in_validation)]
        self.scalars = [m for m in self.metrics if m.reduce != "gather"]
        self.gathered = [m for m in self.metrics if m.reduce == "gather"]
        # One slot per scalar metric, added to by one in-place add per batch (each tensor
        # op has a fixed dispatch cost that shows in a small model's step); the count
        # (the means' denominator) and samples are host numbers.
        self.sums = torch.zeros(len(self.scalars), dtype=torch.float64, device=device)
        self.count: int | float = 0
        self.samples: int | float = 0
        self.rows: dict[str, list[torch.Tensor]] = {m.name: [] for m in self.gathered}

    def add(self, measured: Mapping[str, torch.Tensor], count: int, samples: int = 0) -> None:
        values = [measured[m.name] for m in self.scalars]
        if values and all(isinstance(v, torch.Tensor) for v in values):
            self.sums += torch.stack([v.detach() for v in values]).view(-1)
        else:  # plain numbers from a task: one add each
            for i, v in enumerate(values):
                self.sums[i] += v
        self.count += count
        self.samples += samples or count
        for m in self.gathered:
            self.rows[m.name].append(measured[m.name].detach().cpu())

    def state_dict(self) -> dict[str, Any]:
        """This rank's sums since the last report: a checkpoint keeps every rank's, so a
        resumed run's first report covers the same steps as the uninterrupted run's."""
        return {"sums": self.sums.detach().cpu().clone(), "count": self.count,
                "samples": self.samples, "rows": {k: list(v) for k, v in self.rows.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if tuple(state["sums"].shape) != tuple(self.sums.shape) or set(state["rows"]) != set(
                self.rows):
            raise ValueError(f"metric sums for {len(state['sums'])} metrics and rows "
                             f"{sorted(state['rows'])}; this task reports "
                             f"{len(self.scalars)} and {sorted(self.rows)}")
        self.sums.copy_(state["sums"])
        self.count, self.samples = state["count"], state["samples"]
        self.rows = {k: list(v) for k, v in state["rows"].items()}

    def reduce(self, kind: str) -> dict[str, Any]:
        """Collective: every metric over all ranks, plus "samples"; then start afresh."""
        totals = dist.allreduce_sum([*self.sums.tolist(), self.count, self.samples],
                                    name=f"hpcdp.{kind}_metrics")
        count = max(totals[-2], 1.0)
        values: dict[str, Any] = {}
        for m, total in zip(self.scalars, totals, strict=False):
            values[m.name] = total / count if m.reduce == "mean" else total
        for m in self.gathered:
            mine = torch.cat(self.rows[m.name]) if self.rows[m.name] else None
            every = [t for t in dist.allgather_object(mine, f"hpcdp.{kind}.{m.name}")
                     if t is not None]
            values[m.name] = m.finish(torch.cat(every)) if every else float("nan")  # type: ignore[misc]
        values["samples"] = int(totals[-1])
        self.sums.zero_()
        self.count = self.samples = 0
        self.rows = {m.name: [] for m in self.gathered}
        return values


def evaluate(run: Any) -> dict[str, Any]:
    """Collective (at the end only): the task's metrics over every validation sample once.

    Ranks may read one batch more or less (hpcdp.data.read.evaluation), so nothing in the
    batch loop may be a collective: the sums are reduced once after it.
    """
    watchdog.section("validation")
    run.model.eval()
    sums = MetricSums(run.task.metrics, run.device)
    with torch.no_grad(), autocast(run.cfg, run.device):
        for batch in run.val_reader:
            inputs, targets = run.task.prepare(batch, run.cfg, run.device)
            out = run.model(to_layout(inputs, run.channels_last))
            loss = run.task.loss(out, targets)
            sums.add(run.task.measure(out, targets, loss), run.task.count(targets),
                     len(batch[0]))
    run.model.train()
    values = sums.reduce("val")
    values.update(run.task.derive(values))  # from the reduced sums, not per rank
    return values
