"""Image classification: digits CNN, a small convnet, ResNet-18/50 or a named network
(torchvision:, timm:, a builder of the user's: hpcdp.models.named) on samples-first images.

Reads `image.x_name` (images, any numeric dtype, shaped (C, H, W)) and
`image.y_name` (integer class labels). Integer images are divided by
`image.scale`; training batches are then augmented when `image.augment` says
so (keyed by run.seed, epoch and sample: `hpcdp.data.read.augment`), and
every batch is normalised by `image.mean` / `image.std`, or with
``image.normalize = "file"`` by the per-channel mean and std the training file
stores. Loss: cross entropy; metrics: loss and accuracy, both means over samples.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch
import torch.nn.functional as F

from hpcdp.config import Config, ConfigError, TaskSection, at_least_one, not_empty, not_negative
from hpcdp.data.read.augment import augment
from hpcdp.data.read.samples import ReaderError, open_h5
from hpcdp.models import named
from hpcdp.models.vision import MODELS, build_model
from hpcdp.tasks import Dataset, Metric, Task, default_optimizers

Normalizer = tuple[Any, Any]


@dataclass
class ImageConfig:
    """The image classification task: its datasets, input scaling and model shape."""

    x_name: str = "x"  # the images' dataset in each HDF5 file
    y_name: str = "y"  # the integer class labels' dataset
    scale: float = 255.0  # integer inputs are divided by this
    mean: float = 0.0  # inputs become (x - mean) / std after scaling
    std: float = 1.0  # see image.mean
    # outputs of the classifier; auto: the training file's count, the length of its
    # 'classes' attribute (the image recipes store the class names) or, in a file without
    # names, its largest label + 1. A label past a set count is refused at start.
    num_classes: int | str = "auto"
    width: int = 0  # 0: the model's default width
    cifar_stem: bool = False  # 3x3 stem without max-pool, for 32x32 inputs
    # training batches only, keyed by (run.seed, epoch, sample): none | crop_flip (zero-pad,
    # random crop, left-right flip: small images) | resized_crop_flip (random-resized crop
    # and flip: ImageNet style); docs/data-images.md
    augment: str = "none"
    crop_padding: int = 4  # crop_flip: zero pixels added on each side before the crop
    # resized_crop_flip: range of the box's area, as a fraction of the image's
    crop_scale: list[float] = field(default_factory=lambda: [0.08, 1.0])
    # scalar: image.mean / image.std for every channel; file: the per-channel mean and std
    # stored in the training file (datasets/images.py, datasets/cifar.py)
    normalize: str = "scalar"


def check(cfg: Config) -> None:
    c = cfg.image
    if cfg.model.kwargs and ":" not in cfg.model.name:
        raise ConfigError(f"model.kwargs is for a named network (torchvision:, timm:, a "
                          f"builder); model.name={cfg.model.name!r} takes its shape from "
                          "[image] (image.width, image.cifar_stem)")
    if isinstance(c.num_classes, str):
        if c.num_classes != AUTO:
            raise ConfigError(f"image.num_classes={c.num_classes!r}: a class count (at least "
                              f"1) or {AUTO!r} (the training file's)")
    else:
        at_least_one({"image.num_classes": c.num_classes})
    not_negative({"image.width": c.width, "image.crop_padding": c.crop_padding})
    if c.scale <= 0 or c.std <= 0:
        raise ConfigError("image.scale and image.std must be positive")
    not_empty({"image.x_name": c.x_name, "image.y_name": c.y_name})
    if len(c.crop_scale) != 2 or not 0 < c.crop_scale[0] <= c.crop_scale[1] <= 1:
        raise ConfigError(f"image.crop_scale={c.crop_scale}: expected [low, high] with "
                          "0 < low <= high <= 1")


AUTO = "auto"
#: Labels read at a time when a file's labels are scanned (8 MiB of int64).
LABEL_SCAN = 1 << 20

#: Keys that were the shared sections' before the task had its own.
MOVED = {**{f"data.{k}": k for k in ("x_name", "y_name", "scale", "mean", "std")},
         **{f"model.{k}": k for k in ("num_classes", "width", "cifar_stem")}}
CHOICES = {"augment": ("none", "crop_flip", "resized_crop_flip"),
           "normalize": ("scalar", "file")}


def datasets(cfg: Config) -> Sequence[Dataset]:
    return (Dataset(cfg.image.x_name, "input"), Dataset(cfg.image.y_name, "label", kinds="iub"))


def model(cfg: Config, sample_shape: tuple[int, ...]) -> torch.nn.Module:
    """hpcdp's network model.name names, or a named one (torchvision:, timm:, a builder of
    the user's: hpcdp.models.named), its head sized by image.num_classes."""
    c = cfg.image
    if c.num_classes == AUTO:  # setup fills it from the training file first (from_data)
        raise ConfigError("image.num_classes is 'auto', and no training file has settled it")
    if named.parse(cfg.model.name) is not None:
        return named.image_network(cfg.model.name, cfg.model.kwargs, cfg, sample_shape,
                                   int(c.num_classes))
    return build_model(cfg.model.name, sample_shape, int(c.num_classes), c.width, c.cifar_stem)


def sample_keys(cfg: Config) -> bool:
    """Augmentation needs each training sample's (epoch, index)."""
    return cfg.image.augment != "none"


@functools.lru_cache(maxsize=8)
def file_stats(path: str, x_name: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """The per-channel mean and std a prepared file stores (on the 0..1 scale)."""
    with h5py.File(path, "r") as f:
        if "mean" not in f.attrs or "std" not in f.attrs:
            raise ReaderError(f"{path}: image.normalize='file' needs the per-channel 'mean' "
                              "and 'std' attributes (written by datasets/images.py and "
                              "datasets/cifar.py); this file has none")
        mean = tuple(float(v) for v in np.atleast_1d(f.attrs["mean"]))
        std = tuple(float(v) for v in np.atleast_1d(f.attrs["std"]))
        channels = f[x_name].shape[1] if x_name in f and f[x_name].ndim == 4 else None
    if channels is not None and not len(mean) == len(std) == channels:
        raise ReaderError(f"{path}: 'mean'/'std' hold {len(mean)}/{len(std)} values for "
                          f"{channels} channels")
    if any(not s > 0 for s in std):
        raise ReaderError(f"{path}: the stored std {list(std)} must be positive")
    return mean, std


def label_range(path: str, y_name: str) -> tuple[int, int]:
    """(smallest, largest) label of `path`'s dataset `y_name`; (0, -1) when it has none."""
    st = os.stat(path)
    return _label_range(path, y_name, (st.st_mtime_ns, st.st_size))


@functools.lru_cache(maxsize=8)
def _label_range(path: str, y_name: str, stamp: tuple[int, int]) -> tuple[int, int]:
    # LABEL_SCAN labels at a time: a large file's labels are never in memory whole. The
    # stamp (mtime, size) keeps a rewritten file from being answered from the cache.
    lo, hi = 0, -1
    with open_h5(path) as f:
        y = f[y_name]
        for a in range(0, y.shape[0], LABEL_SCAN):
            part = np.asarray(y[a : a + LABEL_SCAN])
            first = a == 0
            lo = int(part.min()) if first else min(lo, int(part.min()))
            hi = int(part.max()) if first else max(hi, int(part.max()))
    return lo, hi


def named_classes(path: str, y_name: str) -> int | None:
    """How many classes `path` names: its 'classes' attribute (a JSON list, written by the
    image recipes) or its label dataset's 'class_names'; None when it names none."""
    with open_h5(path) as f:
        raw = f.attrs.get("classes", f[y_name].attrs.get("class_names"))
    if raw is None:
        return None
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8", "replace")
    try:
        names = json.loads(raw) if isinstance(raw, str) else np.atleast_1d(raw).tolist()
    except ValueError:
        names = None
    if not isinstance(names, list) or not names:
        raise ReaderError(f"{path}: its class names ('classes' attribute) are not a list of "
                          "names; set image.num_classes")
    return len(names)


def class_count(path: str, y_name: str) -> int:
    """image.num_classes = "auto": the classes `path` names, else its largest label + 1."""
    named = named_classes(path, y_name)
    hi = label_range(path, y_name)[1]
    if named is not None and hi >= named:
        raise ReaderError(f"{path}: its largest label is {hi}, past the {named} classes its "
                          "'classes' attribute names; set image.num_classes")
    return named if named is not None else max(1, hi + 1)


def label_error(path: str, y_name: str, lo: int, hi: int, num_classes: int) -> str | None:
    """Why labels lo..hi do not fit a classifier of `num_classes` outputs, or None."""
    if lo < 0:
        return (f"{path}: label {lo} in {y_name!r} is negative; class labels run from 0 to "
                "image.num_classes - 1")
    if hi >= num_classes:
        return (f"{path}: its largest label is {hi}, past image.num_classes = {num_classes} "
                f"(the model outputs classes 0..{num_classes - 1}); set image.num_classes = "
                f"{AUTO!r} to take the file's class count, or at least {hi + 1}")
    return None


def from_data(cfg: Config, path: Path) -> Config:
    """The config with image.num_classes = "auto" made the training file's count (so the
    run's config.toml and checkpoints record the number the model was built with)."""
    c = cfg.image
    if c.num_classes != AUTO:
        return cfg
    return with_num_classes(cfg, class_count(str(path), c.y_name))


def with_num_classes(cfg: Config, count: int) -> Config:
    """`cfg` with image.num_classes = `count` (a copy: `cfg` is left as it was)."""
    key, values = cfg.own_section()
    return dataclasses.replace(cfg, task_section=(key, dataclasses.replace(values,
                                                                           num_classes=count)))


def check_file(cfg: Config, path: Path) -> None:
    """Every label of `path` inside 0..image.num_classes - 1, and the stored statistics
    where image.normalize uses them: on every rank, before any collective."""
    c = cfg.image
    if c.normalize == "file":
        file_stats(str(path), c.x_name)
    count = c.num_classes
    if count == AUTO:  # a file scored alone (hpcdp eval) under a config left on auto
        count = class_count(str(Path(cfg.data.path) / cfg.data.train_file), c.y_name)
    lo, hi = label_range(str(path), c.y_name)
    error = label_error(str(path), c.y_name, lo, hi, int(count))
    if error:
        raise ReaderError(error)


@functools.lru_cache(maxsize=8)
def _stats_on(path: str, x_name: str, device: torch.device) -> Normalizer:
    mean, std = file_stats(path, x_name)
    return (torch.tensor(mean, device=device).view(1, -1, 1, 1),
            torch.tensor(std, device=device).view(1, -1, 1, 1))


def normalizer(cfg: Config, device: torch.device) -> Normalizer | None:
    """(mean, std) to apply after scaling, or None when they change nothing."""
    c = cfg.image
    if c.normalize == "file":
        return _stats_on(str(Path(cfg.data.path) / cfg.data.train_file), c.x_name, device)
    if c.mean != 0.0 or c.std != 1.0:
        return c.mean, c.std
    return None


def to_input(x: torch.Tensor, cfg: Config, device: torch.device,
             keys: torch.Tensor | None = None) -> torch.Tensor:
    """Stored dtype -> float on the device; integer inputs are scaled to [0, 1] first, then
    augmented (training batches with `keys`) and normalised. On an accelerator the
    integers are converted, augmented and normalised there."""
    integer = not torch.is_floating_point(x)
    norm = normalizer(cfg, device)
    # One new tensor, then in-place arithmetic on it (the batch the reader handed over
    # is never written to).
    if integer and device.type != "cpu":
        # The stored integers travel (a quarter of float32's bytes, from the reader's
        # pinned memory) and become float on the device, not on the host.
        x = x.to(device, non_blocking=True).to(torch.float32)
    else:
        x = x.to(device, torch.float32, non_blocking=True, copy=norm is not None)
    if integer:
        x.div_(cfg.image.scale)
    if keys is not None:
        c = cfg.image
        x = augment(x, keys, c.augment, cfg.run.seed, c.crop_padding,
                    (c.crop_scale[0], c.crop_scale[1]))
    if norm is not None:
        x.sub_(norm[0]).div_(norm[1])
    return x


def prepare(batch: Any, cfg: Config, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, y) from validation, or (x, y, keys) from training with augmentation on."""
    x, y, *keys = batch
    return to_input(x, cfg, device, keys[0] if keys else None), y.to(device, non_blocking=True)


def loss(out: Any, y: torch.Tensor) -> torch.Tensor:
    """Cross entropy of the logits (the output, or its `.logits`: hpcdp.models.named)."""
    return F.cross_entropy(named.logits(out).float(), y)


def measure(out: Any, y: torch.Tensor, mean_loss: torch.Tensor
            ) -> Mapping[str, torch.Tensor]:
    """Sums over this batch: the loss (mean times samples) and the correct predictions
    (accumulated in float64 by MetricSums)."""
    return {"loss": mean_loss.detach() * len(y), "acc": (named.logits(out).argmax(1) == y).sum()}


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
    check_file=check_file,
    from_data=from_data,
    sample_keys=sample_keys,
    named=("torchvision", "timm", "builder"),
    section=TaskSection("image", ImageConfig, check, choices=CHOICES, moved=MOVED),
)
