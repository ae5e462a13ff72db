"""Horovod itself is correct on this build, under each launcher we support.

hvd_ops also runs the equivalence suite (workers/hvd_equivalence.py): the
collectives against reference results, on 2 and 3 ranks, through MPI and Gloo.
`make test-stock` runs this file on a stock Horovod build as well.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.parallel


# Three ranks through Gloo run Horovod's own code on an odd world (uneven allgathers, the
# ring); three through MPI add Open MPI's own algorithms for three ranks: CI's second tier.
@pytest.mark.parametrize(("launcher", "np_"), [
    ("mpirun", 2), pytest.param("mpirun", 3, marks=pytest.mark.extended), ("horovodrun", 2),
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


def test_two_rank_gloo_allreduce_same_bits_on_every_rank(ranks) -> None:
    """NaN, +-0, +-inf and denormals in every op and dtype, both sides of the size
    where hpcdp's Gloo build switches from one exchange to Gloo's ring."""
    run = ranks("hvd_pair_bits", np=2, launcher="horovodrun-gloo", timeout=180)
    assert run.output.count("all-reduces agree bit for bit") == 2, run.describe()
