"""Horovod itself is correct on this build, under each launcher we support."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.parallel


@pytest.mark.parametrize("launcher", ["mpirun", "horovodrun", "horovodrun-gloo"])
def test_horovod_collectives(ranks, launcher: str) -> None:
    run = ranks("hvd_ops", np=2, launcher=launcher, timeout=180)
    assert run.output.count("all Horovod checks passed") == 2, run.describe()


def test_grad_buckets_match_distributed_optimizer(ranks) -> None:
    run = ranks("grad_buckets", np=2, timeout=180)
    assert run.output.count("grad buckets agree with DistributedOptimizer") == 2, run.describe()


@pytest.mark.parametrize("np_", [1, 2, 3])  # 1: the sums stay local (no Horovod call)
def test_metric_sums_over_unequal_ranks(ranks, np_: int) -> None:
    run = ranks("metric_sums", np=np_, timeout=120)
    assert run.output.count("metric sums agree") == np_, run.describe()
