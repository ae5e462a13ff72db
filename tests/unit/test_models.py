"""Model shapes, parameter counts and the registry's errors."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hpcdp.models import vision as m
from hpcdp.train.numerics import count_parameters


def test_digits_cnn_output_and_no_batchnorm() -> None:
    net = m.build_model("digits_cnn", (1, 8, 8), 10)
    assert net(torch.zeros(4, 1, 8, 8)).shape == (4, 10)
    assert not any(isinstance(x, nn.BatchNorm2d) for x in net.modules())


@pytest.mark.parametrize("size", [8, 20, 32])
def test_small_cnn_takes_any_size_from_8(size: int) -> None:
    net = m.build_model("small_cnn", (3, size, size), 5, width=8)
    assert net(torch.rand(2, 3, size, size)).shape == (2, 5)
    with pytest.raises(m.ModelError, match="at least 8x8"):
        m.build_model("small_cnn", (3, 6, 6), 5)


def test_resnet18_standard_size() -> None:
    net = m.build_model("resnet18", (3, 224, 224), 1000)
    # torchvision's ResNet-18 has 11,689,512 parameters; ours has the same layout.
    assert count_parameters(net) == 11_689_512


def test_resnet50_standard_size() -> None:
    net = m.build_model("resnet50", (3, 224, 224), 1000)
    assert count_parameters(net) == 25_557_032


@pytest.mark.parametrize("name", ["resnet18", "resnet50"])
def test_cifar_stem_small_width(name: str) -> None:
    net = m.build_model(name, (3, 32, 32), 10, width=8, cifar_stem=True)
    out = net(torch.randn(2, 3, 32, 32))
    assert out.shape == (2, 10)
    out.sum().backward()
    assert all(p.grad is not None for p in net.parameters())


def test_residual_branches_start_as_identity() -> None:
    net = m.build_model("resnet18", (3, 32, 32), 10, width=8, cifar_stem=True)
    blocks = [b for b in net.modules() if isinstance(b, m.BasicBlock)]
    assert blocks and all(float(b.body[-1].weight.detach().abs().sum()) == 0.0 for b in blocks)


def test_errors() -> None:
    with pytest.raises(m.ModelError, match="unknown model 'vgg'"):
        m.build_model("vgg", (1, 8, 8), 10)
    with pytest.raises(m.ModelError, match="square"):
        m.build_model("resnet18", (3, 32, 16), 10)
    with pytest.raises(m.ModelError, match=r"\(C, H, W\)"):
        m.build_model("digits_cnn", (64,), 10)


def test_convert_sync_batchnorm_keeps_state() -> None:
    class Fake(nn.BatchNorm2d):
        pass

    net = m.build_model("resnet18", (3, 32, 32), 10, width=8, cifar_stem=True)
    bn = net.stem[1]
    with torch.no_grad():
        bn.running_mean.fill_(0.25)
    m.convert_sync_batchnorm(net, Fake)
    assert isinstance(net.stem[1], Fake)
    assert float(net.stem[1].running_mean[0]) == 0.25
    assert not any(type(x) is nn.BatchNorm2d for x in net.modules())
