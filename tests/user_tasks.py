"""A user's own task as its source text, written into a folder outside the repository.

`MYTASK` is what docs/your-model.md shows: its own network, loss and metric, built on the
image task with `dataclasses.replace`. `BROKEN` and `NETWORKS` hold the bad references of
tests/parallel/test_bad_references.py: an attribute that is no Task, builders (a task's,
a network's for model.name) that raise or return something else than a network.
"""

from __future__ import annotations

from pathlib import Path

MYTASK = '''\
"""My task: the image task's data and input transform, my network, loss and metric."""
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from hpcdp.tasks import Metric, image


class TinyNet(nn.Module):
    """Flatten, one hidden layer, the class scores."""

    def __init__(self, inputs: int, hidden: int, classes: int) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(inputs, hidden), nn.ReLU(),
                                  nn.Linear(hidden, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def build_model(cfg, sample_shape):
    """The network for samples shaped (C, H, W), from the config alone."""
    c, h, w = sample_shape
    return TinyNet(c * h * w, cfg.image.width or 16, int(cfg.image.num_classes))


def loss(out, y):
    return F.cross_entropy(out.float(), y, label_smoothing=0.1)


def measure(out, y, mean_loss):
    """The image task's sums (loss, accuracy) and mine: how often the label is in the top 2."""
    top2 = (out.topk(2, dim=1).indices == y[:, None]).any(dim=1).sum()
    return {**image.measure(out, y, mean_loss), "top2": top2}


TASK = replace(image.TASK, name="mytask", models=("tiny_mlp",), build_model=build_model,
               loss=loss, measure=measure, metrics=(*image.TASK.metrics, Metric("top2")),
               defaults={"model": {"name": "tiny_mlp"}})
'''

BROKEN = '''\
"""Tasks that import but cannot train: for the table of bad references."""
from dataclasses import replace

from hpcdp.tasks import image


def build(cfg, sample_shape):
    return None


def raising(cfg, sample_shape):
    raise RuntimeError("my builder is out of order")


def not_a_module(cfg, sample_shape):
    return {"weights": []}


TASK = image.TASK
RAISES = replace(image.TASK, name="raises", build_model=raising)
NOT_MODULE = replace(image.TASK, name="not_module", build_model=not_a_module)
'''

NETWORKS = '''\
"""Network builders for model.name (image task): one that works, and the table's bad ones."""
from torch import nn


def build(cfg, sample_shape):
    c, h, w = sample_shape
    return nn.Sequential(nn.Flatten(), nn.Linear(c * h * w, int(cfg.image.num_classes)))


def raising(cfg, sample_shape):
    raise RuntimeError("my network builder broke")


def not_a_module(cfg, sample_shape):
    return [nn.Linear(1, 1)]
'''

FAILS_ON_IMPORT = '''\
"""A task file whose import fails."""
RATE = 1 / 0
'''


def write(folder: Path, name: str = "mytask.py", source: str = MYTASK) -> Path:
    """`source` saved as folder/name (folder made); returns its path."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(source)
    return path
