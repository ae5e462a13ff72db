"""Typed training configuration: defaults < TOML file < `key.sub=value` overrides.

Every key has a declared type, so a typo or a wrong type fails loudly with the
key's name instead of silently training with a default. This module needs no
PyTorch or Horovod: every rank validates the same config before any collective.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import importlib.util
import json
import math
import os
import pkgutil
import re
import sys
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from hpcdp import profile_spec, references

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on 3.10
    import tomli as tomllib


class ConfigError(ValueError):
    """A config file or override is missing, malformed, unknown or of the wrong type."""


@dataclass
class RunConfig:
    """Identity, length and reproducibility of a run."""

    name: str = "default"  # names the run folder runs/<name> when run.dir is empty
    dir: str = ""  # empty: runs/<name>; ${VAR} expands (also in data.path, checkpoint.*)
    seed: int = 0  # initial weights, data order and per-rank random streams
    epochs: int = 1  # passes over the training data
    max_steps: int = 0  # stop after this many optimizer steps in total; 0: no limit
    stop_at_step: int = 0  # test hook: checkpoint and stop at this step as if preempted; 0: off
    # Per-rank torch.profiler traces of chosen steps into <run dir>/profiles (docs/profiling.md):
    # "steps=20-25" (at most 10 steps), optionally "ranks=0,1" and "stacks", "shapes"; "": off
    profile: str = ""
    precision: str = "fp32"  # fp32 | bf16 | fp16 (fp16 needs a GPU; uses a GradScaler)
    device: str = "auto"  # auto | cpu | cuda
    # auto: on CPUs, where the launcher leaves the node's ranks sharing one CPU mask
    # (horovodrun), pin each rank to its own share of it, as mpirun would | none
    cpu_bind: str = "auto"
    on_nan: str = "stop"  # non-finite loss/gradients: stop (error, no save) | skip the update
    # The stall watchdog (docs/stalls.md): abort the job, naming the ranks behind, when no
    # step boundary comes within the bound. Negative: auto (the larger of stall_floor_s and
    # stall_multiple x the slowest step, validation or checkpoint seen so far; the first of
    # each, and the start, get stall_warmup_factor x the floor); positive: a fixed bound in
    # seconds; 0: off.
    step_timeout_s: float = -1.0
    stall_floor_s: float = 300.0  # the auto bound never falls below this many seconds
    stall_multiple: float = 10.0  # auto bound: this many times the slowest interval seen
    stall_warmup_factor: float = 3.0  # the start and each first interval get this x the floor
    compile: bool = False  # compile the model with torch.compile (docs/gpu.md)
    compile_mode: str = "default"  # torch.compile mode: default | reduce-overhead | max-autotune
    # auto: channels_last memory format for convnets on GPUs, where cuDNN is faster with it;
    # on: also on CPUs (tests); off: never
    channels_last: str = "auto"
    tf32: bool = True  # fp32 matmuls and convolutions in TF32 on GPUs that have it (Ampere on)
    # experiment trackers rank 0 logs the run to as well (docs/tracking.md): mlflow | wandb,
    # each with its extra installed (pip install 'hpcdp[mlflow]'); empty: none
    trackers: list[str] = field(default_factory=list)
    tracker_project: str = "hpcdp"  # the MLflow experiment and the W&B project
    # the W&B group (an MLflow tag): empty: the sweep folder's name in a sweep's array
    # task, "array-" and the array's job id in another array task, else none
    tracker_group: str = ""
    # MLflow's tracking URI; empty: MLFLOW_TRACKING_URI, else a local store in the run folder
    mlflow_uri: str = ""
    # at the end of a run, wait at most this long for trackers to send what they hold
    tracker_close_timeout_s: float = 30.0
    # an MLflow server that does not answer its health check in this long is off for the run
    tracker_connect_timeout_s: float = 5.0
    # at the normal end of a run, export the model (`hpcdp export`) into the run folder's
    # model/ and log that folder to every tracker as an artifact
    tracker_model: bool = False


@dataclass
class DataConfig:
    """Where the sharded HDF5 data lies and how each rank reads it."""

    path: str = ""  # folder holding train_file and val_file
    train_file: str = "train.h5"  # inside data.path
    val_file: str = "val.h5"  # inside data.path
    batch_size: int = 32  # per rank
    global_batch_size: int = 0  # if set: per-rank batch = this / ranks (must divide)
    val_batch_size: int = 0  # per rank; 0: same as the training batch
    window_samples: int = 0  # shuffle window; 0: the reader's default
    virtual_shards: int = 0  # 0: the reader's default
    prefetch: int = 2  # batches read ahead by the background thread
    stage_dir: str = ""  # node-local copy read instead of data.path ($VAR per node); empty: off


@dataclass
class TaskConfig:
    """The workload: what is read, the model family, the loss and the metrics (hpcdp.tasks)."""

    # the workload: a built-in task (a module hpcdp.tasks.<name>), an installed package's
    # (entry points hpcdp.tasks), or your own: package.module:ATTR or path/to/file.py:ATTR
    # (a relative path from the config file's folder; recorded absolute)
    name: str = "image"


@dataclass
class ModelConfig:
    """Which network of the task's; its shape options live in the task's own section."""

    # one of the task's models (its defaults choose one), or a named network
    # (docs/your-model.md): torchvision:NAME | timm:NAME (image) | transformers:CONFIGCLASS
    # | transformers:FILE.json (lm) | package.module:callable | path/to/file.py:callable (a
    # builder given the config and the sample shape; a relative path from the config
    # file's folder, recorded absolute); never downloads weights
    name: str = "digits_cnn"
    sync_bn: bool = False  # replace BatchNorm with Horovod's SyncBatchNorm
    # keyword arguments of a named network's builder, as a table ([model.kwargs]; on the
    # command line model.kwargs={depth=2, ...}, which replaces the whole table)
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class OptimConfig:
    """The optimizer; `lr` is the peak rate for `ref_batch` samples per update.

    The peak rate of a run is lr x (global batch / ref_batch) under the linear
    rule, lr x sqrt(global batch / ref_batch) under sqrt, lr under none: it
    follows the global batch, never the number of ranks.
    """

    name: str = "sgd"  # sgd | adamw | lars | lamb (hpcdp.optim; docs/training.md)
    lr: float = 0.1  # the peak rate for ref_batch samples per update
    ref_batch: int = 32  # the global batch (samples per update) that lr is stated for
    lr_scaling: str = "linear"  # linear | sqrt | none: how the peak rate follows the batch
    allow_lr_change: bool = False  # resume even when the peak rate would differ from the run's
    momentum: float = 0.9  # SGD and LARS
    nesterov: bool = False  # SGD with momentum only
    # L2 (SGD, LARS) or decoupled (AdamW, LAMB) weight decay; never on biases, norm
    # layers or embeddings (hpcdp.optim.groups)
    weight_decay: float = 0.0
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])  # AdamW/LAMB (beta1, beta2)
    trust_coefficient: float = 0.001  # LARS's eta: a layer's rate is lr eta |w| / (|g| + wd |w|)
    grad_clip: float = 0.0  # clip the averaged gradients' global L2 norm to this; 0: off
    # auto: torch's fused kernel (one pass over every parameter) for SGD and AdamW where
    # the parameters are all dense floating-point tensors on one CPU or CUDA device | off.
    # A resumed run keeps the kernel its checkpoint was written with (torch's rule).
    fused: str = "auto"


@dataclass
class ScheduleConfig:
    """Learning-rate schedule: linear warmup, then cosine, polynomial, step or constant."""

    kind: str = "cosine"  # cosine | polynomial | step | constant
    warmup_epochs: float = 0.0  # linear warmup to the peak rate; fractions allowed
    warmup_start_factor: float = 0.0  # warmup starts at this fraction of the peak lr
    min_factor: float = 0.0  # cosine and polynomial end at this fraction of the peak lr
    power: float = 2.0  # kind = "polynomial": (1 - progress)^power from the peak to the end
    milestones: list[float] = field(default_factory=list)  # epochs, for kind = "step"
    gamma: float = 0.1  # factor applied at each milestone, for kind = "step"


@dataclass
class HorovodConfig:
    """Horovod's knobs: fusion, compression, accumulation, reduction."""

    # HOROVOD_FUSION_THRESHOLD; negative: the environment's, else 1 MiB for CPU tensors
    # through MPI and Horovod's 128 MiB on GPUs and under Gloo (hpcdp.runtime.hvd_settings)
    fusion_threshold_mb: float = -1.0
    # HOROVOD_CYCLE_TIME; negative: the environment's, else 50 ms where Horovod wakes on
    # enqueue (CPU training with hpcdp's Horovod build), else Horovod's 1 ms
    cycle_time_ms: float = -1.0
    # none | fp16 | bf16 (bfloat16 on the wire through hpcdp's gradient buckets, as
    # Horovod has no bf16 all-reduce: docs/training.md) | powersgd (low-rank factors
    # with error feedback: docs/large-batch.md)
    compression: str = "none"
    # PowerSGD: the rank of the factors each matrix-shaped gradient is sent as
    powersgd_rank: int = 4
    # PowerSGD: steps averaged uncompressed first (the first factors would be poor)
    powersgd_warmup_steps: int = 10
    # PowerSGD: gradients of fewer elements (or vectors, or too small to gain at the
    # rank) are sent whole, in the same all-reduce as the P factors
    powersgd_min_elements: int = 4096
    backward_passes_per_step: int = 1  # gradient accumulation
    op: str = "average"  # average | adasum
    gradient_predivide_factor: float = 1.0  # divide before the sum, the rest after
    # Gradients in flat buckets of this many MiB, each all-reduced in place when full
    # (hpcdp.runtime.grad_buckets); 0: Horovod's DistributedOptimizer (per-tensor requests,
    # Horovod's fusion); negative: 64 MiB buckets on CPUs, the DistributedOptimizer on
    # GPUs. Adasum and fp16 compression always use the DistributedOptimizer; so must
    # a model with sparse gradients (set 0). PowerSGD makes its own all-reduces; bf16
    # compression always uses the buckets (64 MiB where negative, on GPUs too).
    bucket_mb: float = -1.0
    # Gradients of sparse embedding tables (nn.Embedding(sparse=True)): sparse (Horovod
    # all-gathers each rank's rows and ids) | dense (sparse_as_dense: the whole table is
    # all-reduced). Such tables always take Horovod's DistributedOptimizer.
    sparse_grads: str = "sparse"
    timeline: str = ""  # HOROVOD_TIMELINE file; relative paths are inside the run dir
    # Horovod's stall inspector (MPI controller only), whole seconds: warn after
    # stall_check_s (HOROVOD_STALL_CHECK_TIME_SECONDS, Horovod's default 60), shut down
    # after stall_shutdown_s (HOROVOD_STALL_SHUTDOWN_TIME_SECONDS, default never), which
    # Horovod ignores below the check time (refused here). Negative: the environment's or
    # Horovod's default. hpcdp's own watchdog (run.step_timeout_s) works under any controller.
    stall_check_s: float = -1.0
    stall_shutdown_s: float = -1.0  # see stall_check_s; negative: the environment's, else never


@dataclass
class CheckpointConfig:
    """When checkpoints are written, how many are kept, and what resume means."""

    every_steps: int = 0  # 0: only at the end (and on preemption)
    keep: int = 3  # newest checkpoint files kept
    resume: str = "auto"  # auto | none | <path to a checkpoint file>
    dir: str = ""  # empty: <run dir>/checkpoints
    allow_group_write: bool = False  # resume from files your group can write (shared folders)
    strict_permissions: bool = True  # refuse to resume what others could write; false: warn


@dataclass
class PreemptConfig:
    """Signals that ask the job to checkpoint and stop, and what follows."""

    enabled: bool = True  # install the signal handlers
    signals: list[str] = field(default_factory=lambda: ["USR1", "TERM"])  # ask to stop
    check_every: int = 1  # agree on the flag every N steps (all ranks same schedule)
    requeue: bool = True  # `scontrol requeue` the Slurm job after the checkpoint
    # Requeue no more once the job has been requeued this often (SLURM_RESTART_COUNT),
    # so that a job that cannot make progress stops instead of looping.
    max_requeues: int = 20


@dataclass
class LogConfig:
    """Rank-0 reporting: log lines, JSONL, TensorBoard, progress bar."""

    every_steps: int = 10  # a log line and a metrics record every N steps
    jsonl: bool = True  # metrics.jsonl in the run folder
    tensorboard: bool = True  # TensorBoard events in the run folder
    progress: bool = True  # tqdm bar, only when stderr is a terminal
    trace_samples: bool = False  # test aid: every rank writes a fingerprint of each sample


@dataclass
class Config:
    """The whole training configuration."""

    run: RunConfig = field(default_factory=RunConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    horovod: HorovodConfig = field(default_factory=HorovodConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    preempt: PreemptConfig = field(default_factory=PreemptConfig)
    log: LogConfig = field(default_factory=LogConfig)
    # The chosen task's own section as (its key, its values), read as `cfg.<key>`: the task
    # declares it (hpcdp.tasks.<name>.TASK.section), so this module names no task. A field,
    # so that dataclasses.replace keeps it; build() sets it, else the first read does.
    task_section: tuple[str, Any] | None = field(default=None, repr=False)

    def __getattr__(self, name: str) -> Any:
        # Reached only when `name` is no attribute: the task's own section, e.g. cfg.lm.
        if name.startswith("_") or "task_section" not in self.__dict__:
            raise AttributeError(name)  # copy, pickle and dataclass internals probe these
        key, values = self.own_section()
        if key == name:
            return values
        raise AttributeError(f"this config has no section {name!r} (task.name="
                             f"{self.task.name!r}, whose section is {key or 'none'!r})")

    def own_section(self) -> tuple[str, Any]:
        """(key, values) of the task's own section; ("", None) for a task without one."""
        if self.task_section is None:  # a Config() made by hand: the task's defaults
            section = find_task(self.task.name).section
            self.task_section = (section.key, section.type()) if section else ("", None)
        return self.task_section

    def sections(self) -> dict[str, Any]:
        """{section name: its values}, the task's own section right after [model]."""
        key, values = self.own_section()
        out: dict[str, Any] = {}
        for name in SHARED_SECTIONS:
            out[name] = getattr(self, name)
            if name == "model" and key:
                out[key] = values
        return out

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return {name: dataclasses.asdict(values) for name, values in self.sections().items()}

    @property
    def run_dir(self) -> Path:
        return Path(self.run.dir) if self.run.dir else Path("runs") / self.run.name

    @property
    def checkpoint_dir(self) -> Path:
        return Path(self.checkpoint.dir) if self.checkpoint.dir else self.run_dir / "checkpoints"


#: The sections every task shares; a task adds its own (TaskSection).
SHARED_SECTIONS = tuple(f.name for f in dataclasses.fields(Config) if f.name != "task_section")


CHOICES: dict[str, tuple[str, ...]] = {
    "run.precision": ("fp32", "bf16", "fp16"),
    "run.cpu_bind": ("auto", "none"),
    "run.device": ("auto", "cpu", "cuda"),
    "run.on_nan": ("stop", "skip"),
    "run.compile_mode": ("default", "reduce-overhead", "max-autotune"),
    "run.channels_last": ("auto", "on", "off"),
    "optim.name": ("sgd", "adamw", "lars", "lamb"),
    "optim.lr_scaling": ("linear", "sqrt", "none"),
    "optim.fused": ("auto", "off"),
    "schedule.kind": ("cosine", "polynomial", "step", "constant"),
    "horovod.compression": ("none", "fp16", "bf16", "powersgd"),
    "horovod.op": ("average", "adasum"),
    "horovod.sparse_grads": ("sparse", "dense"),
}
SIGNAL_NAMES = ("USR1", "USR2", "TERM", "INT", "HUP")
#: Keys that were renamed or replaced: naming one is an error that names its successor.
RENAMED: dict[str, str] = {
    "optim.scale_lr": "optim.lr_scaling (linear | sqrt | none) with optim.ref_batch, the "
                      "global batch optim.lr is stated for",
}


@dataclass(frozen=True)
class TaskSection:
    """A task's own config section: [key], its dataclass, its checks (hpcdp.tasks.Task.section).

    `check(cfg)` raises ConfigError for values the section's types let through (ranges,
    relations between keys); `choices` lists the allowed strings of a key, by key name;
    `moved` names keys of the shared sections that moved here: {"data.x_name": "x_name"}.
    """

    key: str
    type: type
    check: Callable[[Config], None] | None = None
    choices: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    moved: Mapping[str, str] = field(default_factory=dict)


class TaskSpec(Protocol):
    """What the config needs of a task (hpcdp.tasks.Task has it): its section and defaults."""

    @property
    def name(self) -> str: ...
    @property
    def section(self) -> TaskSection | None: ...
    @property
    def defaults(self) -> Mapping[str, Mapping[str, Any]]: ...


TASKS_PACKAGE = "hpcdp.tasks"


def find_task(name: str) -> TaskSpec:
    """The task `name`: a built-in task, an installed one, or one named by reference.

    Built-in: `TASK` of the module hpcdp.tasks.<name>, imported by name, not by an import
    statement (the tasks import this module, and a new one is listed nowhere). Else an
    entry point of the group `hpcdp.tasks` named `name`; else, for `package.module:ATTR`
    or `path/to/file.py:ATTR` (hpcdp.references), that attribute, which must be a Task.
    An unknown name lists the tasks and the forms of a reference.
    """
    if references.is_reference(name):
        return _checked_task(name, name, *_resolve(name))
    module = None
    if name.isidentifier() and not name.startswith("_"):
        try:
            module = importlib.import_module(f"{TASKS_PACKAGE}.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"{TASKS_PACKAGE}.{name}":
                raise  # the task exists but needs a package that is missing: say that
    task = getattr(module, "TASK", None)
    if task is not None and getattr(task, "name", None) == name:
        return typing.cast(TaskSpec, task)
    installed = references.entry_point(name) if module is None else None
    if installed is not None:
        return _checked_task(name, installed, *_resolve(installed, name))
    extra = references.installed_names()
    listed = ", ".join(task_names()) + (f" (installed: {', '.join(extra)})" if extra else "")
    raise ConfigError(f"task.name={name!r}: choose one of {listed}; or a task of your own "
                      f"as {references.FORMS}")


def _resolve(reference: str, shown: str | None = None) -> tuple[Any, str]:
    try:
        return references.resolve(reference, shown)
    except references.TaskReferenceError as e:
        raise ConfigError(str(e)) from None


def _checked_task(name: str, reference: str, value: Any, where: str) -> TaskSpec:
    """`value` when it is a hpcdp.tasks.Task (a Task exists only once that module ran)."""
    task_type = getattr(sys.modules.get(TASKS_PACKAGE), "Task", None)
    if task_type is None or not isinstance(value, task_type):
        attr = reference.rpartition(":")[2]
        raise ConfigError(f"task.name={name!r}: {attr} in {where} is a "
                          f"{type(value).__name__}, not a hpcdp.tasks.Task")
    return typing.cast(TaskSpec, value)


def task_names() -> list[str]:
    """Every task in hpcdp.tasks (modules exporting a TASK of their own name), sorted."""
    package = importlib.import_module(TASKS_PACKAGE)
    names = []
    for info in pkgutil.iter_modules(package.__path__):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{TASKS_PACKAGE}.{info.name}")
        if getattr(getattr(module, "TASK", None), "name", None) == info.name:
            names.append(info.name)
    return sorted(names)


def _choices(cfg: Config) -> dict[str, tuple[str, ...]]:
    """CHOICES and the task's own, as {"section.key": allowed}."""
    section = find_task(cfg.task.name).section
    own = {f"{section.key}.{k}": v for k, v in section.choices.items()} if section else {}
    return {**CHOICES, **own}


def _section_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _describe(tp: Any) -> str:
    return getattr(tp, "__name__", None) if typing.get_origin(tp) is None else str(tp)


def coerce(key: str, value: Any, tp: Any) -> Any:
    """Check `value` against the declared type `tp`; ints widen to float, nothing else.

    A union (`int | str`: a count or "auto") takes the first member that accepts it.
    """
    origin = typing.get_origin(tp)
    if origin is types.UnionType:
        for member in typing.get_args(tp):
            try:
                return coerce(key, value, member)
            except ConfigError:
                continue
    if origin is dict:
        return free_table(key, value)
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected a list of {item_tp.__name__}, got {value!r}")
        return [coerce(f"{key}[{i}]", v, item_tp) for i, v in enumerate(value)]
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value):
                raise ConfigError(f"{key}: expected a finite number, got {value!r}")
            return float(value)
    elif tp is str:
        if isinstance(value, str):
            return value
    elif origin is not types.UnionType:  # pragma: no cover - an unsupported type is a bug
        raise TypeError(f"{key}: unsupported field type {tp!r}")
    raise ConfigError(
        f"{key}: expected {_describe(tp)}, got {type(value).__name__} {value!r}"
    )


def free_table(key: str, value: Any) -> dict[str, Any]:
    """A table of any keys (a builder's keyword arguments): names are strings, and every
    value is one TOML can write back (no null, no infinity), so the run's config.toml
    and the checkpoint's config rebuild the same network."""
    if not isinstance(value, dict):
        raise ConfigError(f"{key}: expected a table, got {type(value).__name__} {value!r}")
    return {str(k): _table_value(f"{key}.{k}", v) for k, v in value.items()}


def _table_value(key: str, value: Any) -> Any:
    if isinstance(value, dict):
        return free_table(key, value)
    if isinstance(value, list):
        return [_table_value(f"{key}[{i}]", v) for i, v in enumerate(value)]
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{key}: expected a finite number, got {value!r}")
    if not isinstance(value, (bool, int, float, str)):
        raise ConfigError(f"{key}: {type(value).__name__} {value!r} is not a TOML value")
    return value


def _unknown(kind: str, name: str, known: list[str], where: str) -> ConfigError:
    near = difflib.get_close_matches(name, known, n=1)
    hint = f" (did you mean {near[0]!r}?)" if near else ""
    return ConfigError(f"unknown {kind} {name!r} {where}{hint}; known: {', '.join(known)}")


def apply_mapping(cfg: Config, data: dict[str, Any], where: str) -> None:
    """Apply a nested {section: {key: value}} mapping, strictly."""
    sections = cfg.sections()
    for sec, values in data.items():
        if sec not in sections:
            raise _other_tasks_section(cfg, sec, values, where) or _unknown(
                "section", sec, list(sections), where)
        if not isinstance(values, dict):
            raise ConfigError(f"[{sec}] {where} must be a table, got {values!r}")
        obj = sections[sec]
        types = _section_types(type(obj))
        for key, value in values.items():
            if f"{sec}.{key}" in RENAMED:
                raise ConfigError(f"{sec}.{key} {where} is no longer a key: use "
                                  f"{RENAMED[f'{sec}.{key}']}")
            if key not in types:
                new = _moved_to(cfg, f"{sec}.{key}")
                if new:
                    raise ConfigError(f"{sec}.{key} {where} has moved to {new} (the task's own "
                                      f"section): write [{new.split('.')[0]}] {key} = ... "
                                      "instead")
                raise _unknown("key", f"{sec}.{key}", [f"{sec}.{k}" for k in types], where)
            setattr(obj, key, coerce(f"{sec}.{key}", value, types[key]))


def _task_sections(first: str) -> list[tuple[str, TaskSection]]:
    """(task, its section) for every task with one, task `first` first (error paths only:
    this imports every task)."""
    found = [(name, find_task(name).section) for name in [first, *task_names()]]
    return [(name, section) for name, section in found if section is not None]


def _moved_to(cfg: Config, old: str) -> str | None:
    """The key `old` ("data.x_name") moved to in a task's own section, or None."""
    for _, section in _task_sections(cfg.task.name):
        if old in section.moved:
            return f"{section.key}.{section.moved[old]}"
    return None


def _other_tasks_section(cfg: Config, sec: str, values: Any, where: str) -> ConfigError | None:
    """The error for another task's section ([lm] in an image config), or None."""
    owners = [name for name, section in _task_sections(cfg.task.name) if section.key == sec]
    if not owners:
        return None
    keys = list(values) if isinstance(values, dict) else []
    what = f"{sec}.{keys[0]}" if keys else f"[{sec}]"
    return ConfigError(f"{what} {where}: [{sec}] is the section of task {owners[0]!r}, and "
                       f"this config's task is {cfg.task.name!r} (task.name)")


def parse_override(text: str) -> tuple[str, str, Any]:
    """`section.key=value` -> (section, key, value); the value is read as TOML when it can be.

    Bare words that are not valid TOML (`optim.name=sgd`, `run.dir=runs/x`)
    are taken as strings, so quoting is only needed for strings like "1".
    """
    if "=" not in text:
        raise ConfigError(f"override {text!r}: expected section.key=value")
    path, raw = text.split("=", 1)
    parts = path.strip().split(".")
    if len(parts) != 2 or not all(parts):
        raise ConfigError(f"override {text!r}: the key must look like section.key")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return parts[0], parts[1], value


def load_file(path: str | Path) -> dict[str, Any]:
    """Read a TOML file, with errors that name the file."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"config file {str(p)!r} is a folder, not a TOML file")
    if not p.is_file():
        raise ConfigError(f"config file {str(p)!r} does not exist")
    try:
        with p.open("rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {str(p)!r} is not valid TOML: {e}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config file {str(p)!r} is not UTF-8 text (TOML expected)") from None
    except OSError as e:
        raise ConfigError(f"config file {str(p)!r} cannot be read: {e}") from None


TaskDefaults = Callable[[str], Mapping[str, Mapping[str, Any]]]


def build(path: str | Path | None = None, overrides: Sequence[str] = (),
          task_defaults: TaskDefaults | None = None,
          environ: Mapping[str, str] | None = None) -> Config:
    """Defaults, then the task's defaults, then the file, then the overrides; then checks.

    The task is named by the file or an override (task.name) and found by name
    (find_task); its own section joins the config and its defaults apply before the
    file. `task_defaults(name)`, when given, stands in for the task's own defaults.
    `environ` (default: os.environ) expands `${NAME}` in paths: a submission checks
    the config with the job's variables standing in.
    """
    cfg = Config()
    if path is not None and not isinstance(path, (str, os.PathLike)):
        raise ConfigError(f"--config: expected a file path, got {path!r}")  # e.g. --config=--
    mapping = load_file(path) if path is not None else {}
    parsed = [(text, *parse_override(text)) for text in overrides]
    name = chosen_task(mapping, parsed, path)
    task = find_task(name)
    cfg.task.name = name
    cfg.task_section = (task.section.key, task.section.type()) if task.section else ("", None)
    defaults = task.defaults if task_defaults is None else task_defaults(name)
    apply_mapping(cfg, dict(defaults), f"in task {name!r}'s defaults")
    if path is not None:
        apply_mapping(cfg, mapping, f"in {str(path)!r}")
    for text, sec, key, value in parsed:
        apply_mapping(cfg, {sec: {key: value}}, f"in override {text!r}")
    cfg.task.name = name  # a file reference as chosen_task made it: absolute
    cfg.model.name = absolute_model(cfg.model.name, model_folder(mapping, parsed, path))
    expand_paths(cfg, os.environ if environ is None else environ)
    validate(cfg)
    check_paths(cfg)
    return cfg


# Paths that may name environment variables, so that one batch script serves every task
# of a job array: run.dir=runs/r_${SLURM_ARRAY_TASK_ID}.
PATH_KEYS = ("run.dir", "data.path", "checkpoint.dir", "checkpoint.resume")
_VAR = re.compile(r"\$\{([^}]*)\}")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")


def expand_vars(key: str, text: str, environ: Mapping[str, str]) -> str:
    """`${NAME}` in `text` replaced by its value in `environ`; unset or malformed: an error."""

    def value(m: re.Match[str]) -> str:
        name = m[1]
        if not _NAME.match(name):
            raise ConfigError(f"{key}={text!r}: ${{{name}}} is not a variable name")
        if name not in environ:
            raise ConfigError(f"{key}={text!r}: environment variable {name} is not set")
        return environ[name]

    return _VAR.sub(value, text)


def expand_paths(cfg: Config, environ: Mapping[str, str]) -> None:
    """Expand `${NAME}` in the path settings (PATH_KEYS), in place."""
    for key in PATH_KEYS:
        sec, name = key.split(".")
        section = getattr(cfg, sec)
        setattr(section, name, expand_vars(key, getattr(section, name), environ))


def chosen_task(mapping: Mapping[str, Any], parsed: Sequence[tuple[str, str, str, Any]],
                path: str | Path | None = None) -> str:
    """task.name as the overrides, else the file, else the default set it; a relative
    file reference made absolute from the config file's folder (set in the file) or the
    working folder (set by an override), so that every rank imports the same file."""
    name, folder = TaskConfig.name, Path.cwd()
    file_task = mapping.get("task")
    if isinstance(file_task, Mapping) and isinstance(file_task.get("name"), str):
        name = file_task["name"]
        folder = Path(path).parent if path is not None else folder
    for _, sec, key, value in parsed:
        if (sec, key) == ("task", "name") and isinstance(value, str):
            name, folder = value, Path.cwd()
    try:
        return references.absolute(name, folder)
    except references.TaskReferenceError as e:
        raise ConfigError(str(e)) from None


def model_folder(mapping: Mapping[str, Any], parsed: Sequence[tuple[str, str, str, Any]],
                 path: str | Path | None) -> Path:
    """Where a relative path in model.name is taken from: the working folder for an
    override, else the config file's folder."""
    if any((sec, key) == ("model", "name") for _, sec, key, _ in parsed) or path is None:
        return Path.cwd()
    return Path(path).parent


#: model.name prefixes that name a library's network, not a builder of the user's.
LIBRARIES = ("torchvision", "timm", "transformers")


def absolute_model(name: str, folder: Path) -> str:
    """model.name with a relative file in it (`path/file.py:callable`,
    `transformers:file.json`) made absolute from `folder`: every rank, a resume and an
    export then read the same file."""
    prefix, colon, rest = name.partition(":")
    if not colon:
        return name
    if prefix == "transformers" and rest.endswith(".json"):
        return f"{prefix}:{os.path.normpath(os.path.join(os.path.abspath(folder), rest))}"
    target, _, attr = name.rpartition(":")
    if prefix in LIBRARIES or not (target.endswith(".py") or "/" in target):
        return name
    return f"{os.path.normpath(os.path.join(os.path.abspath(folder), target))}:{attr}"


def from_record(mapping: Mapping[str, Any], where: str) -> Config:
    """The config a run recorded (a checkpoint's or an export's `config`), rebuilt with
    its keys and types checked strictly and its task's own checks, but no path checks:
    a trained model is rebuilt where its data and run folder may not be."""
    task_values = mapping.get("task")
    name = task_values.get("name") if isinstance(task_values, Mapping) else None
    if not isinstance(name, str):
        raise ConfigError(f"{where}: the recorded config names no task.name")
    task = find_task(name)
    cfg = Config()
    cfg.task_section = (task.section.key, task.section.type()) if task.section else ("", None)
    apply_mapping(cfg, {k: dict(v) if isinstance(v, Mapping) else v
                        for k, v in mapping.items()}, f"in {where}")
    if task.section is not None and task.section.check is not None:
        task.section.check(cfg)
    return cfg


def validate(cfg: Config) -> None:
    """Range and choice checks that need no data, no model and no runtime."""
    task = find_task(cfg.task.name)
    for key, allowed in _choices(cfg).items():
        sec, name = key.split(".")
        value = getattr(getattr(cfg, sec), name)
        if value not in allowed:
            raise ConfigError(f"{key}={value!r}: choose one of {', '.join(allowed)}")
    positive = {
        "run.epochs": cfg.run.epochs,
        "data.batch_size": cfg.data.batch_size,
        "optim.ref_batch": cfg.optim.ref_batch,
        "horovod.backward_passes_per_step": cfg.horovod.backward_passes_per_step,
        "checkpoint.keep": cfg.checkpoint.keep,
        "preempt.check_every": cfg.preempt.check_every,
        "log.every_steps": cfg.log.every_steps,
    }
    at_least_one(positive)
    non_negative = {
        "run.max_steps": cfg.run.max_steps,
        "run.stop_at_step": cfg.run.stop_at_step,
        "data.global_batch_size": cfg.data.global_batch_size,
        "data.val_batch_size": cfg.data.val_batch_size,
        "data.window_samples": cfg.data.window_samples,
        "data.virtual_shards": cfg.data.virtual_shards,
        "data.prefetch": cfg.data.prefetch,
        "checkpoint.every_steps": cfg.checkpoint.every_steps,
        "schedule.warmup_epochs": cfg.schedule.warmup_epochs,
        "optim.weight_decay": cfg.optim.weight_decay,
        "preempt.max_requeues": cfg.preempt.max_requeues,
        "optim.grad_clip": cfg.optim.grad_clip,
    }
    not_negative(non_negative)
    if not cfg.data.path:
        raise ConfigError("data.path is not set: the folder holding the training data")
    if cfg.optim.lr <= 0:
        raise ConfigError(f"optim.lr={cfg.optim.lr}: must be positive")
    if cfg.horovod.gradient_predivide_factor <= 0:
        raise ConfigError("horovod.gradient_predivide_factor must be positive")
    if cfg.horovod.op == "adasum" and cfg.horovod.gradient_predivide_factor != 1.0:
        raise ConfigError("horovod.gradient_predivide_factor must be 1.0 with horovod.op='adasum'")
    if cfg.horovod.op == "adasum" and cfg.run.precision == "fp16":
        raise ConfigError("horovod.op='adasum' cannot be combined with run.precision='fp16' "
                          "(Adasum steps inside its hooks, where a GradScaler cannot act)")
    if cfg.schedule.kind == "step" and not cfg.schedule.milestones:
        raise ConfigError("schedule.kind='step' needs schedule.milestones (epochs)")
    if sorted(cfg.schedule.milestones) != cfg.schedule.milestones:
        raise ConfigError(f"schedule.milestones={cfg.schedule.milestones}: must be increasing")
    if not 0.0 <= cfg.schedule.warmup_start_factor <= 1.0:
        raise ConfigError("schedule.warmup_start_factor must lie in [0, 1]")
    if not 0.0 <= cfg.schedule.min_factor <= 1.0:
        raise ConfigError("schedule.min_factor must lie in [0, 1]")
    for sig in cfg.preempt.signals:
        if sig not in SIGNAL_NAMES:
            raise ConfigError(f"preempt.signals: {sig!r} is not one of {', '.join(SIGNAL_NAMES)}")
    _check_stall_keys(cfg)
    error = horovod_stall_error(cfg.horovod, os.environ)
    if error:
        raise ConfigError(error)
    if cfg.run.precision == "fp16" and cfg.run.device == "cpu":
        raise ConfigError("run.precision='fp16' needs a GPU (use bf16 or fp32 on CPUs)")
    _validate_more(cfg)
    if task.section is not None and task.section.check is not None:
        task.section.check(cfg)


def at_least_one(values: Mapping[str, float]) -> None:
    """Raise ConfigError naming the first key ("run.epochs") whose value is below 1."""
    for key, value in values.items():
        if value < 1:
            raise ConfigError(f"{key}={value}: must be at least 1")


def not_negative(values: Mapping[str, float]) -> None:
    """Raise ConfigError naming the first key whose value is below 0."""
    for key, value in values.items():
        if value < 0:
            raise ConfigError(f"{key}={value}: must not be negative")


def not_empty(values: Mapping[str, str]) -> None:
    """Raise ConfigError naming the first key whose value is the empty string."""
    for key, value in values.items():
        if not value:
            raise ConfigError(f"{key} must not be empty")


def _validate_more(cfg: Config) -> None:
    """Ranges the optimizer, the seed and the run folder would otherwise reject mid-setup."""
    if not 0 <= cfg.run.seed < 2**63:
        raise ConfigError(f"run.seed={cfg.run.seed}: must lie in [0, 2**63)")
    if cfg.optim.momentum < 0:
        raise ConfigError(f"optim.momentum={cfg.optim.momentum}: must not be negative")
    if cfg.optim.name == "sgd" and cfg.optim.nesterov and cfg.optim.momentum == 0:
        raise ConfigError("optim.nesterov=true needs a positive optim.momentum")
    _validate_optim(cfg)
    _validate_powersgd(cfg.horovod, cfg.run.precision)
    if cfg.schedule.gamma <= 0:
        raise ConfigError(f"schedule.gamma={cfg.schedule.gamma}: must be positive")
    if any(m < 0 for m in cfg.schedule.milestones):
        raise ConfigError(f"schedule.milestones={cfg.schedule.milestones}: must not be negative")
    name = cfg.run.name
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise ConfigError(f"run.name={name!r}: must be a plain folder name (set run.dir for a "
                          "path)")
    not_empty({"data.train_file": cfg.data.train_file, "data.val_file": cfg.data.val_file,
               "checkpoint.resume": cfg.checkpoint.resume})
    _validate_staging(cfg)
    try:
        profile_spec.parse(cfg.run.profile)
    except profile_spec.ProfileSpecError as e:
        raise ConfigError(str(e)) from None
    _validate_trackers(cfg.run)
    for key in ("run.dir", "data.path", "checkpoint.dir", "checkpoint.resume", "horovod.timeline",
                "data.stage_dir"):
        sec, attr = key.split(".")
        if "\0" in getattr(getattr(cfg, sec), attr):
            raise ConfigError(f"{key} must not hold a NUL character")


#: Experiment trackers (hpcdp.train.tracking), each with the module its extra installs.
TRACKERS = {"mlflow": "mlflow", "wandb": "wandb"}


def _validate_trackers(run: RunConfig) -> None:
    """Known tracker names, each once and installed; a project name; a bound that is one."""
    for name in run.trackers:
        if name not in TRACKERS:
            raise _unknown("tracker", name, list(TRACKERS), "in run.trackers")
        if importlib.util.find_spec(TRACKERS[name]) is None:
            raise ConfigError(f"run.trackers names {name!r}, but its package is not installed: "
                              f"pip install 'hpcdp[{name}]'")
    if len(set(run.trackers)) != len(run.trackers):
        raise ConfigError(f"run.trackers={run.trackers}: a tracker is named twice")
    if run.tracker_model and not run.trackers:
        raise ConfigError("run.tracker_model=true logs the model to the trackers, but "
                          "run.trackers is empty")
    if run.trackers and not run.tracker_project:
        raise ConfigError("run.tracker_project must not be empty with run.trackers set")
    for key in ("tracker_close_timeout_s", "tracker_connect_timeout_s"):
        if not 0 <= getattr(run, key) < math.inf:
            raise ConfigError(f"run.{key}={getattr(run, key):g}: must be a finite number of "
                              "seconds, at least 0")


def stage_name_error(key: str, name: str) -> str | None:
    """Why a data file name cannot be staged (it must stay inside the stage dir), or None."""
    parts = name.replace("\\", "/").split("/")
    if os.path.isabs(name) or ".." in parts:
        return (f"{key}={name!r}: with data.stage_dir set, the file must be a path inside "
                "data.path (relative, without '..'), so that its copy lands inside the "
                "stage dir")
    return None


def _validate_powersgd(hc: HorovodConfig, precision: str) -> None:
    """The PowerSGD keys' ranges, and what PowerSGD cannot be combined with."""
    if hc.powersgd_rank < 1:
        raise ConfigError(f"horovod.powersgd_rank={hc.powersgd_rank}: must be at least 1")
    not_negative({"horovod.powersgd_warmup_steps": hc.powersgd_warmup_steps,
                  "horovod.powersgd_min_elements": hc.powersgd_min_elements})
    if hc.compression != "powersgd":
        return
    if hc.op == "adasum":
        raise ConfigError("horovod.compression='powersgd' cannot be combined with "
                          "horovod.op='adasum' (PowerSGD averages)")
    if hc.gradient_predivide_factor != 1.0:
        raise ConfigError("horovod.gradient_predivide_factor must be 1.0 with "
                          "horovod.compression='powersgd' (its factors are summed, then divided)")
    if precision == "fp16":
        raise ConfigError("horovod.compression='powersgd' cannot be combined with "
                          "run.precision='fp16': the residuals would carry the loss scale from "
                          "step to step (use bf16)")


def _validate_staging(cfg: Config) -> None:
    """File names that keep their copies inside data.stage_dir (expanded later, per node)."""
    if not cfg.data.stage_dir:
        return
    for key in ("data.train_file", "data.val_file"):
        error = stage_name_error(key, getattr(cfg.data, key.split(".")[1]))
        if error:
            raise ConfigError(error)


def _validate_optim(cfg: Config) -> None:
    """Betas, clipping (which needs the averaged gradients), LARS's trust, the power."""
    betas = cfg.optim.betas
    if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
        raise ConfigError(f"optim.betas={betas}: two numbers in [0, 1)")
    if cfg.optim.grad_clip > 0 and cfg.horovod.op == "adasum":
        raise ConfigError("optim.grad_clip cannot be combined with horovod.op='adasum' (Adasum "
                          "steps inside its hooks, before any averaged gradient exists)")
    if cfg.optim.trust_coefficient <= 0:
        raise ConfigError(f"optim.trust_coefficient={cfg.optim.trust_coefficient}: must be "
                          "positive")
    if cfg.schedule.power <= 0:
        raise ConfigError(f"schedule.power={cfg.schedule.power}: must be positive")
    _validate_bf16(cfg.horovod)


def _validate_bf16(hc: HorovodConfig) -> None:
    """bf16 compression travels in hpcdp's gradient buckets, which average (no Adasum)."""
    if hc.compression != "bf16":
        return
    if hc.op == "adasum":
        raise ConfigError("horovod.compression='bf16' cannot be combined with "
                          "horovod.op='adasum' (bf16 travels in hpcdp's averaging buckets)")
    if hc.bucket_mb == 0:
        raise ConfigError("horovod.compression='bf16' needs hpcdp's gradient buckets "
                          "(Horovod 0.28 all-reduces no bf16): set horovod.bucket_mb to a "
                          "size in MiB or -1, not 0")


def check_paths(cfg: Config) -> None:
    """Paths that exist but are the wrong kind (a file where a folder belongs, or back).

    Paths that do not exist yet are fine here: the run creates its folders, and
    the data checks name a missing file on every rank before any collective.
    """
    folders = {"data.path": cfg.data.path, "run.dir": str(cfg.run_dir),
               "checkpoint.dir": str(cfg.checkpoint_dir)}
    for key, folder in folders.items():
        if os.path.exists(folder) and not os.path.isdir(folder):
            raise ConfigError(f"{key}: {folder!r} is a file, not a folder")
    files = {"data.train_file": os.path.join(cfg.data.path, cfg.data.train_file),
             "data.val_file": os.path.join(cfg.data.path, cfg.data.val_file)}
    if cfg.checkpoint.resume not in ("auto", "none"):
        files["checkpoint.resume"] = cfg.checkpoint.resume
    if cfg.horovod.timeline:
        files["horovod.timeline"] = str(cfg.run_dir / cfg.horovod.timeline)
    for key, file in files.items():
        if os.path.isdir(file):
            raise ConfigError(f"{key}: {file!r} is a folder, not a file")


def _check_stall_keys(cfg: Config) -> None:
    run = cfg.run
    if run.stall_floor_s <= 0:
        raise ConfigError(f"run.stall_floor_s={run.stall_floor_s:g}: must be positive "
                          "(turn the watchdog off with run.step_timeout_s=0)")
    for key, value in (("run.stall_multiple", run.stall_multiple),
                       ("run.stall_warmup_factor", run.stall_warmup_factor)):
        if value < 1:
            raise ConfigError(f"{key}={value:g}: must be at least 1")


HOROVOD_STALL_CHECK_DEFAULT_S = 60
CHECK_ENV, SHUTDOWN_ENV = "HOROVOD_STALL_CHECK_TIME_SECONDS", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"


def horovod_stall_error(hc: HorovodConfig, environ: Mapping[str, str]) -> str | None:
    """Why Horovod would not act on these stall settings as written, or None (pure).

    Horovod reads both as whole seconds and ignores a shutdown time below the check
    time (it logs "will not shutdown" every check and waits forever). A key left
    negative takes the environment's variable, else Horovod's default.
    """
    for key, value in (("horovod.stall_check_s", hc.stall_check_s),
                       ("horovod.stall_shutdown_s", hc.stall_shutdown_s)):
        if value >= 0 and value != int(value):
            return f"{key}={value:g}: Horovod reads whole seconds; use an integer"
    check, check_from = _stall_value(hc.stall_check_s, "horovod.stall_check_s", CHECK_ENV,
                                     environ, HOROVOD_STALL_CHECK_DEFAULT_S)
    shutdown, shutdown_from = _stall_value(hc.stall_shutdown_s, "horovod.stall_shutdown_s",
                                           SHUTDOWN_ENV, environ, 0)
    if check is None or shutdown is None:
        bad = CHECK_ENV if check is None else SHUTDOWN_ENV
        return f"{bad}={environ.get(bad)!r} in the environment is not a whole number of seconds"
    if 0 < shutdown < check:
        return (f"{shutdown_from}={shutdown} is below the stall check time ({check_from}={check}): "
                f"Horovod ignores such a shutdown time and the job would wait forever. Set "
                f"horovod.stall_check_s to at most {shutdown} (e.g. horovod.stall_check_s="
                f"{max(1, shutdown // 2)}) or horovod.stall_shutdown_s to at least {check}")
    return None


def _stall_value(value: float, key: str, env: str, environ: Mapping[str, str],
                 default: int) -> tuple[int | None, str]:
    """(whole seconds, where it came from) for one of Horovod's stall settings."""
    if value >= 0:
        return int(value), key
    if env in environ:
        try:
            return int(environ[env]), env
        except ValueError:
            return None, env
    return default, f"Horovod's default {env}"


def dumps(cfg: Config) -> str:
    """The effective config as TOML text (for --print-config and the run dir)."""
    lines: list[str] = []
    for sec, values in cfg.to_dict().items():
        lines.append(f"[{sec}]")
        for key, value in values.items():
            lines.append(f"{key} = {toml_value(value)}")
        lines.append("")
    return "\n".join(lines)


def toml_value(value: Any) -> str:
    """`value` as TOML: JSON's text for numbers, strings and lists of them; a table
    (model.kwargs) inline, its keys quoted."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))} = {toml_value(v)}"
                               for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return json.dumps(value)
