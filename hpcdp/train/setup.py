"""Set-up from the config: readers, model, optimizers, schedule. Local: no collectives.

Everything here may fail on one rank only (a file another node cannot see);
the caller gathers the errors with `dist.agree` before any collective depends
on the result.
"""

from __future__ import annotations

import logging
import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hpcdp import profile_spec
from hpcdp.config import Config, ConfigError
from hpcdp.data.read.protocol import TrainingReader, ValidationReader
from hpcdp.runtime.grad_buckets import bucketed
from hpcdp.runtime.hvd_settings import CPU_BUCKET_BYTES
from hpcdp.runtime.powersgd_optimizer import compressed
from hpcdp.tasks import Dataset, Task, read_options
from hpcdp.train import accel
from hpcdp.train import schedule as sched
from hpcdp.train.model_check import built_model, check_kinds, checked_layout, from_data
from hpcdp.train.norm_stats import NormStats, averaged_stats

log = logging.getLogger("hpcdp.train")

# Readers live until the process ends (see dist.shutdown_and_exit): h5py's File.close
# on them crashed intermittently at the end of multi-rank runs.
_KEEP_OPEN: list[TrainingReader | ValidationReader] = []


def keep_open(*readers: TrainingReader | ValidationReader) -> None:
    """Keep `readers` open until the process ends (closed by exit, not by h5py)."""
    _KEEP_OPEN.extend(readers)


@dataclass
class Run:
    """What every rank built before training: the parts the loop, step and checkpoints use."""

    cfg: Config
    task: Task
    device: torch.device
    rank: int
    size: int
    batch: int  # per rank and backward pass
    train_reader: TrainingReader
    val_reader: ValidationReader
    model: torch.nn.Module
    optimizers: list[Any]  # each averages its gradients over ranks (see `distributed`)
    scaler: Any
    schedule: sched.Schedule
    steps_per_epoch: int
    total_steps: int
    # {node: {"train": path, "val": path}} the readers opened, for the summary;
    # data.stage_dir makes them node-local copies (hpcdp.data.staging.collective)
    data_paths_read: dict[str, dict[str, str]] = field(default_factory=dict)
    channels_last: bool = False  # image batches go to the model in NHWC (hpcdp.train.accel)
    # BatchNorm running statistics averaged over ranks after each step (hpcdp.train.norm_stats)
    norm_stats: NormStats | None = None

    @property
    def accum(self) -> int:
        return self.cfg.horovod.backward_passes_per_step

    @property
    def global_batch(self) -> int:
        """Samples per optimizer step over all ranks."""
        return self.batch * self.size * self.accum

    @property
    def root(self) -> bool:
        return self.rank == 0


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def per_rank_batch(cfg: Config, size: int) -> int:
    """data.global_batch_size split over the ranks (must divide), else data.batch_size."""
    g = cfg.data.global_batch_size
    if not g:
        return cfg.data.batch_size
    if g % size:
        raise ConfigError(
            f"data.global_batch_size={g} does not divide over {size} ranks "
            f"(choose a multiple of {size}, or set data.batch_size per rank)"
        )
    return g // size


def uneven_steps_error(steps_per_rank: list[int]) -> str | None:
    """Why the ranks must not start when they would take different numbers of steps.

    Every step ends in collectives; a rank that runs out of data first would leave
    the others waiting forever. The sharded reader gives equal steps by construction;
    this guards any other data source (pure, on what every rank gathered).
    """
    if len(set(steps_per_rank)) <= 1:
        return None
    listed = ", ".join(f"rank {r}: {n}" for r, n in enumerate(steps_per_rank))
    return (f"the ranks would take different numbers of training steps per epoch ({listed}); "
            "uneven data would hang the job at the first step one rank does not reach")


def check_runtime(cfg: Config, device: torch.device, size: int) -> None:
    """Options this device or world cannot honour."""
    if cfg.run.precision == "fp16" and device.type != "cuda":
        raise ConfigError("run.precision='fp16' needs a GPU (use bf16 or fp32 here)")
    if cfg.model.sync_bn and size > 1 and device.type != "cuda":
        raise ConfigError("model.sync_bn=true needs GPUs: Horovod's SyncBatchNorm "
                          "takes CUDA tensors only")
    error = profile_spec.ranks_error(profile_spec.parse(cfg.run.profile), size)
    if error:
        raise ConfigError(error)


def training_reader(cfg: Config, path: Path, names: list[str], batch: int, rank: int,
                    size: int, device: torch.device,
                    accumulation: int | None = None) -> TrainingReader:
    """The shuffled reader with equal steps on every rank: one or two datasets (samples,
    labels) through ShardedReader, more through FieldReader (the same order per field).
    A batch is one step's rows of this rank (read_options; `accumulation` 1: `batch`)."""
    from hpcdp.data.read.multi_field import FieldReader
    from hpcdp.data.read.samples import ShardedReader

    options = read_options(cfg, batch, rank, size, accumulation)
    pin = device.type == "cuda"
    if len(names) > 2:
        return FieldReader(path, names, options, pin_memory=pin)
    return ShardedReader(path, options, x_name=names[0],
                         y_name=names[1] if len(names) > 1 else None, pin_memory=pin)


def readers(cfg: Config, task: Task, rank: int, size: int,
            device: torch.device) -> tuple[TrainingReader, ValidationReader, int]:
    """The training reader (shuffled, equal steps) and the validation reader (every sample)."""
    from hpcdp.data.read.sample_keys import SampleKeys

    batch = per_rank_batch(cfg, size)
    accum = cfg.horovod.backward_passes_per_step
    if task.readers is not None:  # the task reads its own format (the LM: token windows)
        train_reader, val_reader = task.readers(cfg, rank, size, batch, device)
        keep_open(train_reader, val_reader)
        check_step_rows(task, train_reader, batch, accum)
        return train_reader, val_reader, batch
    root = Path(cfg.data.path)
    train_path, val_path = root / cfg.data.train_file, root / cfg.data.val_file
    wanted = list(task.datasets(cfg))
    if not wanted:
        raise ConfigError(f"task {task.name!r} reads no datasets")
    names = [d.name for d in wanted]
    info = checked_layout(train_path, names, min_samples=batch * size * accum)
    check_file(cfg, task, train_path, wanted)
    train_reader = training_reader(cfg, train_path, names, batch, rank, size, device)
    if task.sample_keys(cfg):  # batches also carry (epoch, sample index): keyed augmentation
        train_reader = SampleKeys(train_reader)
    val_reader = validation_reader(cfg, task, val_path, rank, size, batch)
    keep_open(train_reader, val_reader)
    if tuple(val_reader.sample_shape) != tuple(info.sample_shape):
        raise ConfigError(f"{val_path}: samples shaped {tuple(val_reader.sample_shape)}, but "
                          f"{train_path} has {info.sample_shape}")
    return train_reader, val_reader, batch


def check_file(cfg: Config, task: Task, path: Path, wanted: list[Dataset]) -> None:
    """The dtype kinds and (the task's check) the values of one file, before any collective."""
    check_kinds(path, wanted)
    if task.check_file is not None:
        task.check_file(cfg, path)


def validation_reader(cfg: Config, task: Task, path: Path, rank: int, size: int,
                      batch: int) -> ValidationReader:
    """This rank's share of every sample of `path` once (checked first), in batches of
    data.val_batch_size (else `batch`)."""
    if task.readers is not None:
        if task.validation_reader is None:
            raise ConfigError(f"task {task.name!r} cannot read a validation file alone")
        return task.validation_reader(cfg, path, rank, size, batch)
    from hpcdp.data.read.evaluation import SliceReader

    wanted = list(task.datasets(cfg))
    checked_layout(path, [d.name for d in wanted])
    check_file(cfg, task, path, wanted)
    return SliceReader(path, [d.name for d in wanted],
                       batch_size=cfg.data.val_batch_size or batch, rank=rank, world_size=size)


def check_step_rows(task: Task, train_reader: TrainingReader, batch: int, accum: int) -> None:
    """A task's own reader must serve one optimizer step's rows per batch (the trainer
    cuts them into `accum` micro-batches), as read_options builds it."""
    if train_reader.batch_size != batch * accum:
        raise ConfigError(
            f"task {task.name!r}: its training reader serves batches of "
            f"{train_reader.batch_size} rows, but one step of this rank is {batch} x "
            f"horovod.backward_passes_per_step={accum} = {batch * accum} rows; build the "
            "reader from hpcdp.tasks.read_options(cfg, batch, rank, size)")


def model(cfg: Config, task: Task, sample_shape: tuple[int, ...],
          device: torch.device) -> torch.nn.Module:
    """The task's model on `device`, the same initial weights everywhere (broadcast anyway)."""
    torch.manual_seed(cfg.run.seed)
    net = built_model(cfg, task, sample_shape)
    if cfg.model.sync_bn and device.type == "cuda":
        from hpcdp.models.vision import convert_sync_batchnorm
        from hpcdp.runtime import dist

        net = convert_sync_batchnorm(net, dist.sync_batchnorm_class())
    return net.to(device)


def bucket_bytes(cfg: Config, device: torch.device) -> int:
    """Flat gradient bucket size in bytes, or 0 for Horovod's DistributedOptimizer."""
    hc = cfg.horovod
    if hc.compression == "bf16":  # travels in hpcdp's buckets only (Horovod has no bf16)
        return CPU_BUCKET_BYTES if hc.bucket_mb < 0 else max(1, int(hc.bucket_mb * (1 << 20)))
    if hc.op == "adasum" or hc.compression != "none" or hc.bucket_mb == 0:
        return 0
    if hc.bucket_mb < 0:  # auto: measured on CPUs only (see hpcdp.runtime.grad_buckets)
        return 0 if device.type == "cuda" else CPU_BUCKET_BYTES
    return max(1, int(hc.bucket_mb * (1 << 20)))


def distributed(cfg: Config, base: torch.optim.Optimizer, model: torch.nn.Module,
                device: torch.device, size: int) -> Any:
    """`base` wrapped to average gradients over ranks: flat buckets, or Horovod's own.

    An optimizer of sparse embedding tables always takes Horovod's, which averages
    their gradients as `horovod.sparse_grads` says (all-gather of rows, or dense).

    Both wrappers build a new optimizer over the same parameter groups: use only
    the wrapper from here on. On one rank `base` itself is returned (see `train.step`).
    """
    from hpcdp.runtime import dist

    if size == 1:  # nothing to average: no hooks, copies or synchronize() per step
        return base
    mine = {id(p) for group in base.param_groups for p in group["params"]}
    named = [(n, p) for n, p in model.named_parameters() if id(p) in mine]
    if mine & sparse_tables(model):  # flat buckets take dense gradients only
        return dist.distributed_optimizer(base, named, cfg.horovod,
                                          sparse_as_dense=cfg.horovod.sparse_grads == "dense")
    if cfg.horovod.compression == "powersgd":
        return powersgd_optimizer(cfg, base)
    nbytes = bucket_bytes(cfg, device)
    bf16 = cfg.horovod.compression == "bf16"
    if nbytes:
        try:
            return bucketed(base, nbytes, cfg.horovod.backward_passes_per_step,
                            cfg.horovod.gradient_predivide_factor, bf16=bf16)
        except ValueError as e:  # parameters of several dtypes or devices
            if bf16:
                raise ConfigError(f"horovod.compression='bf16' cannot average these "
                                  f"gradients: {e}") from e
            log.warning(f"gradient buckets not used ({e}); Horovod's DistributedOptimizer is")
    return dist.distributed_optimizer(base, named, cfg.horovod)


def powersgd_optimizer(cfg: Config, base: torch.optim.Optimizer) -> Any:
    """`base` averaging its gradients by PowerSGD (hpcdp.runtime.powersgd_optimizer)."""
    hc = cfg.horovod
    try:
        return compressed(base, hc.powersgd_rank, hc.powersgd_warmup_steps,
                          hc.powersgd_min_elements, seed=cfg.run.seed)
    except ValueError as e:  # parameters of several dtypes or devices
        raise ConfigError(f"horovod.compression='powersgd' cannot average these "
                          f"gradients: {e}") from e


def gradient_layout(run: Run) -> dict[str, Any]:
    """Each gradient's bytes in backward's order (the reverse of the parameters'), the
    flat bucket size (0: Horovod's fusion, HOROVOD_FUSION_THRESHOLD bytes): what
    `hpcdp plan` models the all-reduces with, read from a 1-rank run that made none."""
    seen: set[int] = set()
    sizes, shapes = [], []
    for opt in run.optimizers:
        for group in opt.param_groups:
            for p in group["params"]:
                if p.requires_grad and id(p) not in seen:
                    seen.add(id(p))
                    sizes.append(p.numel() * p.element_size())
                    shapes.append(list(p.shape))  # PowerSGD's bytes depend on them
    fusion = os.environ.get("HOROVOD_FUSION_THRESHOLD", "")
    return {"tensor_bytes": sizes[::-1], "tensor_shapes": shapes[::-1],
            "bucket_bytes": bucket_bytes(run.cfg, run.device),
            "fusion_threshold": int(fusion) if fusion.isdigit() else None,
            "sparse": bool(sparse_tables(run.model))}


def sparse_tables(model: torch.nn.Module) -> set[int]:
    """ids of the parameters with sparse gradients: embedding tables built with sparse=True."""
    kinds = (torch.nn.Embedding, torch.nn.EmbeddingBag)
    return {id(m.weight) for m in model.modules() if isinstance(m, kinds) and m.sparse}


def schedule(cfg: Config, steps_per_epoch: int, batch: int, size: int) -> sched.Schedule:
    """The learning rate as a function of the optimizer step, from the config's epochs.

    The peak follows the global batch (optim.lr is stated for optim.ref_batch), never
    the number of ranks.
    """
    o, s = cfg.optim, cfg.schedule
    update = sched.update_batch(batch, size, cfg.horovod.backward_passes_per_step,
                                cfg.horovod.op == "adasum")
    scale = sched.lr_scale(o.lr_scaling, update, o.ref_batch)
    return sched.from_epochs(o.lr, scale, s.kind, steps_per_epoch, cfg.run.epochs,
                             s.warmup_epochs, s.warmup_start_factor, s.min_factor,
                             s.milestones, s.gamma, power=s.power, rule=o.lr_scaling,
                             batch=update, ref_batch=o.ref_batch)


def lr_rule_text(cfg: Config, update_batch: int) -> str:
    """How the peak rate came about, for the start line: 'linear: 0.05 x 64/32'."""
    o = cfg.optim
    if o.lr_scaling == "none":
        return "lr_scaling none"
    ratio = f"{update_batch}/{o.ref_batch}"
    factor = ratio if o.lr_scaling == "linear" else f"sqrt({ratio})"
    return f"{o.lr_scaling}: {o.lr:g} x {factor}"


def build(cfg: Config, task: Task, rank: int, size: int, device: torch.device) -> Run:
    """Every part of the run on this rank; raises on bad data or options (no collectives)."""
    check_runtime(cfg, device, size)
    cfg = from_data(cfg, task)
    train_reader, val_reader, batch = readers(cfg, task, rank, size, device)
    net = model(cfg, task, tuple(train_reader.sample_shape), device)
    channels_last = accel.prepare_model(cfg, net, device)  # layout, TF32, torch.compile
    seed_everything(cfg.run.seed + rank)  # per-rank streams for anything random later
    optimizers = [distributed(cfg, opt, net, device, size) for opt in task.optimizers(cfg, net)]
    scaler = torch.amp.GradScaler("cuda") if cfg.run.precision == "fp16" else None
    steps_per_epoch = train_reader.steps_per_epoch  # a batch is a step's micro-batches
    total_steps = cfg.run.epochs * steps_per_epoch
    if cfg.run.max_steps:
        total_steps = min(total_steps, cfg.run.max_steps)
    return Run(cfg, task, device, rank, size, batch, train_reader, val_reader, net, optimizers,
               scaler, schedule(cfg, steps_per_epoch, batch, size), steps_per_epoch, total_steps,
               channels_last=channels_last, norm_stats=averaged_stats(net, size))
