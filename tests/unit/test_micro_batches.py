"""Accumulation reads a step's rows at once and cuts them into micro-batches: micro-batch
m of rank r is what rank r*k+m of k times as many ranks reads (so 1 rank accumulating 2
computes the rows 2 ranks compute), and the cut keeps every item of a batch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hpcdp.config import Config
from hpcdp.data.read import order as pt
from hpcdp.tasks import read_options
from hpcdp.train.step import micro_batches


def test_tensors_tuples_dicts_and_none_are_cut_alike() -> None:
    x, y = torch.arange(12).reshape(6, 2), torch.arange(6)
    parts = micro_batches((x, None, {"y": y, "w": [y * 2]}), 3)
    assert len(parts) == 3
    for m, (px, none, rest) in enumerate(parts):
        assert torch.equal(px, x[2 * m:2 * m + 2]) and none is None
        assert torch.equal(rest["y"], y[2 * m:2 * m + 2])
        assert torch.equal(rest["w"][0], 2 * y[2 * m:2 * m + 2])
    assert parts[1][0].data_ptr() == x[2:].data_ptr()  # views, not copies


def test_one_part_is_the_batch_itself() -> None:
    batch = (torch.zeros(5), object())
    assert micro_batches(batch, 1)[0] is batch


@pytest.mark.parametrize("batch, words", [
    (torch.zeros(5, 2), "5 rows cannot be cut into horovod.backward_passes_per_step=2"),
    (torch.tensor(3.0), "0 rows"),
    ((torch.zeros(4), "text"), "type str cannot be cut"),
])
def test_a_batch_that_cannot_be_cut_is_named(batch, words: str) -> None:
    with pytest.raises((ValueError, TypeError), match=words):
        micro_batches(batch, 2)


@pytest.mark.parametrize("world, accumulation", [(1, 2), (1, 4), (2, 2), (3, 2), (1, 16)])
def test_micro_batch_m_of_rank_r_is_rank_rk_plus_m_of_k_times_the_ranks(
        world: int, accumulation: int) -> None:
    cfg, batch = Config(), 4
    cfg.horovod.backward_passes_per_step = accumulation
    opts = read_options(cfg, batch, 0, world)
    assert opts.batch_size == batch * accumulation
    g, v = opts.global_batch, opts.virtual_shards
    assert v % (world * accumulation) == 0
    common = dict(num_samples=500, block=7, seed=3, epoch=1, global_batch=g, virtual_shards=v,
                  window=11)
    wide = world * accumulation
    for r in range(world):
        reads = pt.rank_order(**common, rank=r, world_size=world)
        for m in range(accumulation):
            alone = pt.rank_order(**common, rank=r * accumulation + m, world_size=wide)
            cut = [micro_batches(torch.from_numpy(step), accumulation)[m] for step in reads]
            assert np.array_equal(np.stack([c.numpy() for c in cut]), alone)


def test_without_accumulation_the_options_are_the_batch() -> None:
    cfg = Config()
    opts = read_options(cfg, 8, 1, 2)
    assert (opts.batch_size, opts.virtual_shards) == (8, None)
    cfg.horovod.backward_passes_per_step = 3
    assert read_options(cfg, 8, 1, 2, accumulation=1).batch_size == 8  # a script's own loop


def test_a_task_reader_serving_micro_batches_is_refused_naming_the_rows() -> None:
    from types import SimpleNamespace

    from hpcdp.config import ConfigError
    from hpcdp.train.setup import check_step_rows

    task, reader = SimpleNamespace(name="mine"), SimpleNamespace(batch_size=8)
    check_step_rows(task, SimpleNamespace(batch_size=16), 8, 2)
    with pytest.raises(ConfigError, match=r"task 'mine': its training reader serves batches "
                       r"of 8 rows, but one step of this rank is 8 x horovod.backward_passes_"
                       r"per_step=2 = 16 rows; build the reader from hpcdp.tasks.read_options"):
        check_step_rows(task, reader, 8, 2)
