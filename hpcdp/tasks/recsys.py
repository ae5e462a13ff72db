"""Click prediction: a DLRM-style model on click logs written by datasets/clicks.py.

Reads three row-aligned datasets: `dense` (float features), `sparse` (one id
per categorical field) and `label` (0/1). The model is built from the training
file's `table_sizes`; every id and label of both files is checked on every rank
before the first collective (`recsys.check_data`). Two optimizers: the tables'
(Adagrad or SparseAdam, sparse gradients, averaged as `horovod.sparse_grads`
says) and the MLPs' (`[optim]`); both follow the one schedule, the tables at
`recsys.table_lr / optim.lr` times the MLPs' rate.

Metrics: `logloss` (mean binary cross-entropy), `auc` over the whole
validation split (every rank's logits and labels gathered, one exact AUC; not
in training windows), and `table_mb`, the table gradients one rank hands to
Horovod per batch in the chosen mode (training windows only).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from hpcdp.config import Config, ConfigError, TaskSection, at_least_one
from hpcdp.data.format.clicks import ClickSchema, check_rows, read_schema
from hpcdp.data.read.samples import ReaderError
from hpcdp.models.dlrm import ClickModel, loss_fn, split_params
from hpcdp.optim import build
from hpcdp.runtime import sparse_grads as grads
from hpcdp.tasks import Dataset, Metric, Task
from hpcdp.tasks.auc import auc_logloss


@dataclass
class RecsysConfig:
    """The click model task (DLRM): its model shape and the optimizer of its tables.

    optim.lr is the MLPs' rate (Adam); the tables take their own optimizer and rate,
    and both follow the same schedule and batch rule (docs/recsys.md).
    """

    embed_dim: int = 16  # width of every embedding row (and of the bottom MLP's output)
    bottom: list[int] = field(default_factory=lambda: [64])  # bottom MLP's hidden widths
    top: list[int] = field(default_factory=lambda: [64])  # top MLP's hidden widths
    table_optim: str = "adagrad"  # adagrad | sparse_adam: the tables' sparse optimizer
    table_lr: float = 0.05  # the tables' peak rate (for optim.ref_batch samples per update)
    # Adagrad's initial accumulator: above 0 it damps a rarely seen row's first steps
    # (about table_lr whatever the gradient at 0): slower to learn, slower to overfit
    initial_accumulator: float = 0.0
    check_data: bool = True  # scan every id and label of both files on every rank at start


def check(cfg: Config) -> None:
    r = cfg.recsys
    at_least_one({"recsys.embed_dim": r.embed_dim})
    if r.table_lr <= 0 or r.initial_accumulator < 0:
        raise ConfigError("recsys.table_lr must be positive, recsys.initial_accumulator "
                          "not negative")
    if any(w < 1 for w in (*r.bottom, *r.top)):
        raise ConfigError("recsys.bottom and recsys.top: every width must be at least 1")


def datasets(cfg: Config) -> Sequence[Dataset]:
    return (Dataset("dense", "input", kinds="f"), Dataset("sparse", "ids", kinds="iu"),
            Dataset("label", "label", kinds="biuf"))


@functools.lru_cache(maxsize=8)
def schema(path: str) -> ClickSchema:
    """The click layout of `path` (read once per process)."""
    return read_schema(path)


def train_schema(cfg: Config) -> ClickSchema:
    return schema(str(Path(cfg.data.path) / cfg.data.train_file))


def check_file(cfg: Config, path: Path) -> None:
    """Layout, the same tables as the training file, and (recsys.check_data) every value."""
    mine, train = schema(str(path)), train_schema(cfg)
    if mine.table_sizes != train.table_sizes:
        raise ReaderError(f"{path}: table_sizes {list(mine.table_sizes)} differ from "
                          f"{train.path}'s {list(train.table_sizes)}")
    if cfg.recsys.check_data:
        check_rows(mine)


def build_model(cfg: Config, sample_shape: tuple[int, ...]) -> torch.nn.Module:
    s, r = train_schema(cfg), cfg.recsys
    net = ClickModel(s.dense_features, s.table_sizes, r.embed_dim, r.bottom, r.top)
    grads.coalesce_table_grads(split_params(net)[0])  # one row per distinct id reaches Horovod
    return net


def table_bytes(cfg: Config, ids: torch.Tensor) -> float:
    """Bytes of table gradients this batch hands to Horovod in the configured mode."""
    s = train_schema(cfg)
    unique = grads.unique_rows(ids) if cfg.horovod.sparse_grads == "sparse" else []
    return float(grads.table_payload(cfg.horovod.sparse_grads, unique, s.table_sizes,
                                      cfg.recsys.embed_dim))


def prepare(batch: Any, cfg: Config, device: torch.device) -> tuple[Any, Any]:
    """(dense, sparse) inputs; targets (labels, this batch's table gradient bytes)."""
    dense, sparse, label = batch
    inputs = (dense.to(device, non_blocking=True).float(), sparse.to(device, non_blocking=True))
    return inputs, (label.to(device, non_blocking=True).float(), table_bytes(cfg, sparse))


def loss(logits: torch.Tensor, targets: Any) -> torch.Tensor:
    return loss_fn(logits.float(), targets[0])


def measure(logits: torch.Tensor, targets: Any, mean_loss: torch.Tensor
            ) -> Mapping[str, torch.Tensor]:
    """Sums for the means (log loss, MB), and (logit, label) rows for the gathered AUC."""
    label, nbytes = targets
    rows = len(label)
    return {"logloss": mean_loss.detach().double() * rows,
            "auc": torch.stack([logits.detach().float(), label.float()], 1).cpu(),
            "table_mb": torch.tensor(nbytes / 2**20 * rows, dtype=torch.float64)}


def auc_of_rows(rows: torch.Tensor) -> float:
    """Exact AUC of every gathered (logit, label) row."""
    return auc_logloss(rows[:, 0].numpy(), rows[:, 1].numpy())["auc"]


def optimizers(cfg: Config, model: torch.nn.Module) -> list[torch.optim.Optimizer]:
    """[the tables' sparse optimizer, the MLPs' optimizer from [optim]]."""
    tables, rest = split_params(model)
    r, params = cfg.recsys, [p for _, p in tables]
    if r.table_optim == "adagrad":
        table_opt: torch.optim.Optimizer = torch.optim.Adagrad(
            params, lr=r.table_lr, initial_accumulator_value=r.initial_accumulator)
    else:
        table_opt = torch.optim.SparseAdam(params, lr=r.table_lr)
    for group in table_opt.param_groups:  # the schedule sets lr = its rate x lr_scale
        group["lr_scale"] = r.table_lr / cfg.optim.lr
    return [table_opt, build.optimizer(cfg, model, [p for _, p in rest])]


TASK = Task(
    name="recsys",
    models=("dlrm",),
    datasets=datasets,
    build_model=build_model,
    prepare=prepare,
    loss=loss,
    measure=measure,
    metrics=(Metric("logloss", "mean"),
             Metric("auc", "gather", finish=auc_of_rows, in_training=False),
             Metric("table_mb", "mean", in_validation=False)),
    optimizers=optimizers,
    count=lambda targets: len(targets[0]),
    check_file=check_file,
    defaults={
        "model": {"name": "dlrm"},
        # Adam for the MLPs at a fixed rate; Adagrad adapts the tables' rates itself.
        "optim": {"name": "adamw", "lr": 1e-3, "lr_scaling": "none"},
        "schedule": {"kind": "constant"},
    },
    section=TaskSection("recsys", RecsysConfig, check,
                        choices={"table_optim": ("adagrad", "sparse_adam")}),
)
