"""The networks hpcdp trains: CNNs for 8x8 digits and small colour images, ResNet-18/50.

torchvision does not import beside the CPU build of PyTorch used here, so the
package carries its own ResNet (He et al. 2016), with a CIFAR-style stem for
32x32 inputs and a width option so tests and benchmarks can shrink it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn


class DigitsCNN(nn.Module):
    """Two 3x3 convolutions, one pooling, two linear layers: ~98% on 8x8 digits.

    No batch norm and no dropout, so data-parallel runs can be compared exactly.
    """

    def __init__(self, in_channels: int = 1, num_classes: int = 10, width: int = 16,
                 image_size: int = 8) -> None:
        super().__init__()
        if image_size % 2:
            raise ValueError(f"digits_cnn needs an even image size, got {image_size}")
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, padding=1),
            nn.ReLU(inplace=True),
            nn.Conv2d(width, 2 * width, 3, padding=1),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
        )
        flat = 2 * width * (image_size // 2) ** 2
        self.head = nn.Sequential(
            nn.Flatten(), nn.Linear(flat, 4 * width), nn.ReLU(inplace=True),
            nn.Linear(4 * width, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


class SmallCNN(nn.Module):
    """Three stages of two 3x3 convolutions with batch norm, each halving the size, then
    global average pooling and one linear layer: a quick convnet for small colour images
    (about 0.3 M parameters at width 32), any size of at least 8x8."""

    def __init__(self, in_channels: int = 3, num_classes: int = 10, width: int = 32) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        cin = in_channels
        for i in range(3):
            w = width * 2**i
            for _ in range(2):
                layers += [nn.Conv2d(cin, w, 3, padding=1, bias=False), nn.BatchNorm2d(w),
                           nn.ReLU(inplace=True)]
                cin = w
            layers.append(nn.MaxPool2d(2))
        self.features = nn.Sequential(*layers)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                                  nn.Linear(cin, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with an identity (or 1x1 projection) shortcut."""

    expansion = 1

    def __init__(self, cin: int, width: int, stride: int) -> None:
        super().__init__()
        cout = width * self.expansion
        self.body = nn.Sequential(
            nn.Conv2d(cin, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width),
            nn.ReLU(inplace=True),
            nn.Conv2d(width, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout),
        )
        self.shortcut = _shortcut(cin, cout, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.shortcut(x))


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (strided), 1x1 expand by 4, as in ResNet-50."""

    expansion = 4

    def __init__(self, cin: int, width: int, stride: int) -> None:
        super().__init__()
        cout = width * self.expansion
        self.body = nn.Sequential(
            nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
            nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width),
            nn.ReLU(inplace=True),
            nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout),
        )
        self.shortcut = _shortcut(cin, cout, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.shortcut(x))


def _shortcut(cin: int, cout: int, stride: int) -> nn.Module:
    if stride == 1 and cin == cout:
        return nn.Identity()
    return nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))


class ResNet(nn.Module):
    """Stem, four stages (widths w, 2w, 4w, 8w), global pooling, linear head."""

    def __init__(self, block: type[BasicBlock] | type[Bottleneck], depths: Sequence[int],
                 in_channels: int = 3, num_classes: int = 1000, width: int = 64,
                 cifar_stem: bool = False) -> None:
        super().__init__()
        if cifar_stem:
            stem: list[nn.Module] = [nn.Conv2d(in_channels, width, 3, 1, 1, bias=False)]
        else:
            stem = [nn.Conv2d(in_channels, width, 7, 2, 3, bias=False)]
        stem += [nn.BatchNorm2d(width), nn.ReLU(inplace=True)]
        if not cifar_stem:
            stem.append(nn.MaxPool2d(3, 2, 1))
        self.stem = nn.Sequential(*stem)
        stages: list[nn.Module] = []
        cin = width
        for i, depth in enumerate(depths):
            w = width * 2**i
            blocks: list[nn.Module] = []
            for j in range(depth):
                blocks.append(block(cin, w, 2 if (j == 0 and i > 0) else 1))
                cin = w * block.expansion
            stages.append(nn.Sequential(*blocks))
        self.stages = nn.Sequential(*stages)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                                  nn.Linear(cin, num_classes))
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        # Zero the last BN of each residual branch: each block starts as identity,
        # which Goyal et al. (2017) found to help large-batch training.
        for m in self.modules():
            if isinstance(m, (BasicBlock, Bottleneck)):
                nn.init.zeros_(m.body[-1].weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.stages(self.stem(x)))


Builder = Callable[..., nn.Module]


def _digits(in_channels: int, num_classes: int, width: int, cifar_stem: bool,
            image_size: int) -> nn.Module:
    return DigitsCNN(in_channels, num_classes, width or 16, image_size)


def _small(in_channels: int, num_classes: int, width: int, cifar_stem: bool,
           image_size: int) -> nn.Module:
    if image_size < 8:
        raise ModelError(f"small_cnn halves the image three times: needs at least 8x8, got "
                         f"{image_size}x{image_size}")
    return SmallCNN(in_channels, num_classes, width or 32)


def _resnet(block: type[BasicBlock] | type[Bottleneck], depths: Sequence[int]) -> Builder:
    def build(in_channels: int, num_classes: int, width: int, cifar_stem: bool,
              image_size: int) -> nn.Module:
        return ResNet(block, depths, in_channels, num_classes, width or 64, cifar_stem)
    return build


MODELS: dict[str, Builder] = {
    "digits_cnn": _digits,
    "small_cnn": _small,
    "resnet18": _resnet(BasicBlock, (2, 2, 2, 2)),
    "resnet50": _resnet(Bottleneck, (3, 4, 6, 3)),
}


class ModelError(ValueError):
    """An unknown model name, or a model that cannot take the data's samples."""


def check_name(name: str) -> None:
    if name not in MODELS:
        raise ModelError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}")


def build_model(name: str, sample_shape: Sequence[int], num_classes: int, width: int = 0,
                cifar_stem: bool = False) -> nn.Module:
    """The named model for samples of shape (channels, height, width)."""
    check_name(name)
    if len(sample_shape) != 3:
        raise ModelError(
            f"model {name!r} needs samples shaped (C, H, W), got {tuple(sample_shape)}")
    c, h, w = sample_shape
    if h != w:
        raise ModelError(f"model {name!r} needs square images, got {h}x{w}")
    return MODELS[name](c, num_classes, width, cifar_stem, h)


def convert_sync_batchnorm(module: nn.Module, sync_bn_cls: type[nn.Module]) -> nn.Module:
    """Replace every BatchNorm2d by `sync_bn_cls` (hvd.SyncBatchNorm), keeping its state."""
    if isinstance(module, nn.BatchNorm2d):
        new = sync_bn_cls(module.num_features, module.eps, module.momentum, module.affine,
                          module.track_running_stats)
        new.load_state_dict(module.state_dict())
        return new
    for name, child in module.named_children():
        module.add_module(name, convert_sync_batchnorm(child, sync_bn_cls))
    return module
