"""Which buffers hpcdp.train.norm_stats averages over ranks (the collective itself is
tested on 2 ranks in tests/parallel/test_batchnorm_ranks.py)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hpcdp.models.vision import build_model
from hpcdp.train import norm_stats as ns


def test_every_running_mean_and_variance_of_a_convnet() -> None:
    net = build_model("resnet18", (3, 8, 8), 4, width=2, cifar_stem=True)
    bns = [m for m in net.modules() if isinstance(m, nn.BatchNorm2d)]
    found = ns.running_buffers(net)
    assert len(bns) == 20 and len(found) == 40
    want = {id(t) for m in bns for t in (m.running_mean, m.running_var)}
    assert {id(t) for t in found} == want  # the module's own tensors, not copies


def test_layers_that_keep_no_statistics_or_sync_them_are_left_out() -> None:
    class Synced(nn.BatchNorm2d):
        pass

    net = nn.Sequential(nn.BatchNorm2d(3), nn.BatchNorm2d(3, track_running_stats=False),
                        Synced(3), nn.Conv2d(3, 3, 1))
    assert [id(t) for t in ns.running_buffers(net, (Synced,))] == [
        id(net[0].running_mean), id(net[0].running_var)]
    assert ns.averaged_stats(net, 1) is None  # one rank: nothing to average
    assert ns.averaged_stats(build_model("digits_cnn", (1, 8, 8), 4), 2) is None  # no BN


def test_one_flat_buffer_of_one_dtype() -> None:
    stats = ns.NormStats(ns.running_buffers(nn.Sequential(nn.BatchNorm2d(3), nn.BatchNorm1d(5))))
    assert stats.nbytes == 2 * (3 + 5) * 4 and [p.numel() for p in stats.parts] == [3, 3, 5, 5]
    mixed = [torch.zeros(3), torch.zeros(3, dtype=torch.float64)]
    with pytest.raises(ValueError, match="several dtypes or devices"):
        ns.NormStats(mixed)

