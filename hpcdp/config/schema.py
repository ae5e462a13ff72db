"""What a training config holds: its sections, typed, and the task's own section.

Every key has a declared type and a default; the comment on a key's line is its
documentation (docs/config.md is generated from it by hpcdp.config_doc). A task's own
section is found through the task, named by task.name (find_task).
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
import sys
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from hpcdp import references


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
