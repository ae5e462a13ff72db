"""Metric reduction over ranks with unequal counts: means, sums and a gathered metric.

Rank r adds r + 1 batches of 3 samples each (rank 2 of 3 adds none), so counts
differ; the gathered metric sees every rank's rows once, in rank order.
"""

from __future__ import annotations

import horovod.torch as hvd
import torch

from hpcdp.tasks import Metric
from hpcdp.train.evaluate import MetricSums


def main() -> None:
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    metrics = (Metric("loss", "mean"), Metric("hits", "sum"),
               Metric("rows", "gather", finish=lambda rows: rows[:, 0].tolist(),
                      in_training=False))
    sums = MetricSums(metrics, torch.device("cpu"))
    batches = 0 if rank == size - 1 and size > 2 else rank + 1
    for b in range(batches):
        rows = torch.tensor([[10.0 * rank + b, 1.0]] * 3)
        sums.add({"loss": torch.tensor(3.0 * (rank + 1)), "hits": torch.tensor(2.0),
                  "rows": rows}, count=3)
    got = sums.reduce("check")
    per_rank = [0 if r == size - 1 and size > 2 else r + 1 for r in range(size)]
    samples = 3 * sum(per_rank)
    assert got["samples"] == samples, got
    want_loss = sum(3.0 * (r + 1) * n for r, n in enumerate(per_rank)) / samples
    assert abs(got["loss"] - want_loss) < 1e-12, (got, want_loss)
    assert got["hits"] == 2.0 * sum(per_rank), got
    want_rows = [10.0 * r + b for r, n in enumerate(per_rank) for b in range(n) for _ in range(3)]
    assert got["rows"] == want_rows, got
    assert MetricSums(metrics, torch.device("cpu"), training=True).gathered == []
    plain = MetricSums(metrics[:2], torch.device("cpu"))  # a task may measure plain numbers
    plain.add({"loss": 0.5 * (rank + 1), "hits": 1}, count=1)
    got = plain.reduce("plain")
    assert got["samples"] == size and got["hits"] == size, got
    assert abs(got["loss"] - sum(0.5 * (r + 1) for r in range(size)) / size) < 1e-12, got
    print(f"rank {rank}: metric sums agree", flush=True)


if __name__ == "__main__":
    main()
