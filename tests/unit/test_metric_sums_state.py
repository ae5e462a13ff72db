"""A rank's training-metric sums between reports, as a checkpoint keeps them."""

from __future__ import annotations

import pytest
import torch

from hpcdp.tasks import Metric
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

