"""Bucket planning (pure) and when training uses flat gradient buckets."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from hpcdp.config import Config
from hpcdp.runtime.grad_buckets import plan
from hpcdp.train.setup import bucket_bytes


@given(st.lists(st.integers(1, 5000), min_size=1, max_size=60), st.integers(1, 20000))
def test_plan_covers_every_item_once_in_order(sizes: list[int], target: int) -> None:
    runs = plan(sizes, target)
    assert [i for run in runs for i in run] == list(range(len(sizes)))
    for run in runs[:-1]:
        held = sum(sizes[i] for i in run)
        assert held >= target  # full buckets ...
        assert held - sizes[run[-1]] < target  # ... closed by the item that filled them


def test_plan_examples() -> None:
    assert plan([4, 4, 4, 4], 8) == [range(0, 2), range(2, 4)]
    assert plan([10, 1, 1], 8) == [range(0, 1), range(1, 3)]
    assert plan([1, 1, 1], 100) == [range(0, 3)]
    with pytest.raises(ValueError, match="at least one element"):
        plan([1], 0)


def test_bucket_size_choice() -> None:
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    cfg = Config()
    assert bucket_bytes(cfg, cpu) == 64 << 20  # auto: buckets on CPUs ...
    assert bucket_bytes(cfg, gpu) == 0  # ... Horovod's optimizer on GPUs
    cfg.horovod.bucket_mb = 0
    assert bucket_bytes(cfg, cpu) == 0
    cfg.horovod.bucket_mb = 1.5
    assert bucket_bytes(cfg, gpu) == 3 << 19  # asked for explicitly
    cfg.horovod.compression = "fp16"
    assert bucket_bytes(cfg, cpu) == 0  # buckets do not compress
    cfg.horovod.compression, cfg.horovod.op = "none", "adasum"
    assert bucket_bytes(cfg, cpu) == 0
