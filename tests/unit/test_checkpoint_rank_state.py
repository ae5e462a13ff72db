"""Per-rank state and checkpoints: a rank's training-metric sums between reports (kept),
the optimizer state Horovod's Adasum leaves per rank (warned about on resume)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hpcdp.tasks import Metric
from hpcdp.train.checkpoints import holds_tensors
from hpcdp.train.evaluate import MetricSums

METRICS = (Metric("loss", "mean"), Metric("acc", "mean"))


def test_sums_round_trip_into_a_fresh_window() -> None:
    a = MetricSums(METRICS, torch.device("cpu"), training=True)
    a.add({"loss": torch.tensor(3.5), "acc": torch.tensor(2.0)}, 4)
    state = a.state_dict()
    a.add({"loss": torch.tensor(1.0), "acc": torch.tensor(1.0)}, 4)  # the copy stays apart
    b = MetricSums(METRICS, torch.device("cpu"), training=True)
    b.load_state_dict(state)
    assert b.sums.tolist() == [3.5, 2.0] and (b.count, b.samples) == (4, 4)


def test_sums_of_another_task_are_refused() -> None:
    state = MetricSums(METRICS[:1], torch.device("cpu"), training=True).state_dict()
    with pytest.raises(ValueError, match="metric sums for 1 metrics"):
        MetricSums(METRICS, torch.device("cpu"), training=True).load_state_dict(state)


def test_optimizer_state_that_adasum_keeps_per_rank() -> None:
    w = nn.Parameter(torch.ones(2))
    plain, heavy = torch.optim.SGD([w], lr=0.1), torch.optim.SGD([w], lr=0.1, momentum=0.9)
    w.grad = torch.ones(2)
    plain.step()
    assert not holds_tensors([plain])  # momentum 0: nothing per parameter to lose
    heavy.step()
    assert holds_tensors([plain, heavy])
