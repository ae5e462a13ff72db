"""Horovod itself is correct on this build, under each launcher we support."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.parallel


@pytest.mark.parametrize(("launcher", "np_"), [("mpirun", 2), ("horovodrun", 2),
                                               ("horovodrun-gloo", 2), ("horovodrun-gloo", 3)])
def test_horovod_collectives(ranks, launcher: str, np_: int) -> None:
    run = ranks("hvd_ops", np=np_, launcher=launcher, timeout=180)
    assert run.output.count("all Horovod checks passed") == np_, run.describe()


def test_grad_buckets_match_distributed_optimizer(ranks) -> None:
    run = ranks("grad_buckets", np=2, timeout=180)
    assert run.output.count("grad buckets agree with DistributedOptimizer") == 2, run.describe()


@pytest.mark.parametrize("np_", [1, 2, 3])  # 1: the sums stay local (no Horovod call)
def test_metric_sums_over_unequal_ranks(ranks, np_: int) -> None:
    run = ranks("metric_sums", np=np_, timeout=120)
    assert run.output.count("metric sums agree") == np_, run.describe()
