"""Image classification: digits CNN and ResNet-18/50 on samples-first image arrays.

Reads `image.x_name` (images, any numeric dtype, shaped (C, H, W)) and
`image.y_name` (integer class labels). Integer images are divided by
`image.scale`, then normalised by `image.mean` / `image.std`. Loss: cross
entropy; metrics: loss and accuracy, both means over samples.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from hpcdp.config import Config
from hpcdp.models.vision import MODELS, build_model
from hpcdp.tasks import Dataset, Metric, Task, default_optimizers


def datasets(cfg: Config) -> Sequence[Dataset]:
    return (Dataset(cfg.image.x_name, "input"), Dataset(cfg.image.y_name, "label", kinds="iub"))


def model(cfg: Config, sample_shape: tuple[int, ...]) -> torch.nn.Module:
    c = cfg.image
    return build_model(cfg.model.name, sample_shape, c.num_classes, c.width, c.cifar_stem)


def to_input(x: torch.Tensor, cfg: Config, device: torch.device) -> torch.Tensor:
    """Stored dtype -> float on the device; integer inputs are scaled to [0, 1] first.
    On an accelerator the integers are converted and normalised there."""
    integer = not torch.is_floating_point(x)
    # One new tensor, then in-place arithmetic on it (the batch the reader handed over
    # is never written to).
    if integer and device.type != "cpu":
        # The stored integers travel (a quarter of float32's bytes, from the reader's
        # pinned memory) and become float on the device, not on the host.
        x = x.to(device, non_blocking=True).to(torch.float32)
    else:
        x = x.to(device, torch.float32, non_blocking=True,
                 copy=cfg.image.mean != 0.0 or cfg.image.std != 1.0)
    if integer:
        x.div_(cfg.image.scale)
    if cfg.image.mean != 0.0 or cfg.image.std != 1.0:
        x.sub_(cfg.image.mean).div_(cfg.image.std)
    return x


def prepare(batch: Any, cfg: Config, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = batch
    return to_input(x, cfg, device), y.to(device, non_blocking=True)


def loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out.float(), y)


def measure(out: torch.Tensor, y: torch.Tensor, mean_loss: torch.Tensor
            ) -> Mapping[str, torch.Tensor]:
    """Sums over this batch: the loss (mean times samples) and the correct predictions
    (accumulated in float64 by MetricSums)."""
    return {"loss": mean_loss.detach() * len(y), "acc": (out.argmax(1) == y).sum()}


TASK = Task(
    name="image",
    models=tuple(MODELS),
    datasets=datasets,
    build_model=model,
    prepare=prepare,
    loss=loss,
    measure=measure,
    metrics=(Metric("loss", "mean"), Metric("acc", "mean")),
    optimizers=default_optimizers,
)
