"""Workloads ("tasks"): what a run reads, its model, loss and metrics; the rest is shared.

A task is one `Task` value (plain data and functions, no subclassing), in its
own module `hpcdp.tasks.<name>` exporting `TASK`; `config.task.name` chooses
it. The training package (hpcdp.train) asks the task for:

- `datasets(cfg)`: the HDF5 datasets each file must hold, with the dtype kinds
  allowed (checked on every rank before any collective);
- `build_model(cfg, sample_shape)`: the network, on the CPU, no collectives;
- `prepare(batch, cfg, device)`: a batch as the readers yield it, one tensor
  per dataset in `datasets(cfg)` order (`(x, None)` for a task that reads one
  dataset) -> (inputs, targets) on the device, the input transform included;
- `loss(outputs, targets)`: the mean loss of a batch (what backward sees);
- `measure(outputs, targets, loss)`: per metric, this batch's contribution
  (see `Metric.reduce`); `count(targets)`: the denominator of "mean" metrics;
- `optimizers(cfg, model)`: one optimizer, or several over disjoint parameters
  (a dense one and a sparse one for embedding tables, say); each is averaged
  over ranks by its own distributed wrapper;
- `check_file(cfg, path)` (optional): the values of a data file (ids inside
  their tables, labels in range), on every rank before any collective; raises
  with the file, field and rows;
- `from_data(cfg, train_path)` (optional): the config with the values it leaves to the
  data filled from the training file (image.num_classes = "auto"), once the file's
  layout is checked and before `check_file`; the run records the filled values;
- `defaults`: config values the task changes (any section), applied before the
  config file;
- `section` (optional): the task's own config section (hpcdp.config.TaskSection):
  its key ([image]), its dataclass, its checks, its keys' choices and the shared
  keys that moved into it. The config finds a task by its name alone, so a new
  built-in workload is one new module here exporting TASK (and its data recipe); a
  user's own is a Task anywhere, named by reference (`task.name =
  "package.module:ATTR"` or `"path/to/file.py:ATTR"`, hpcdp.references) or declared by
  an installed package under the entry-point group `hpcdp.tasks`.

Optional:

- `readers(cfg, rank, size, batch, device)`: the task's own (training reader,
  validation batches) instead of the sharded image readers: a
  `hpcdp.data.read.protocol.TrainingReader` (set_epoch, iteration, len,
  steps_per_epoch, state_dict/load_state_dict; `sample_shape` where it has one),
  built from `read_options(cfg, batch, rank, size)` (whose batches hold a whole
  optimizer step of this rank: batch x horovod.backward_passes_per_step rows), and
  a `ValidationReader`,
  iterable afresh for each validation, this rank's share of every sample once;
- `validation_reader(cfg, path, rank, size, batch)`: with `readers`, the validation
  batches of any file of the task's format alone (`hpcdp eval`);
- `derive(values)`: metrics computed from the reduced ones (perplexity from the
  mean loss: never a mean of per-rank values), for training windows and validation;
- `rates(cfg, model, samples_per_s, ranks, device)`: throughput figures beside
  samples/s over all `ranks` (tokens/s, MFU), for the log lines and summary.json;
- `sample_keys(cfg)`: True when the training batches should also carry each
  sample's (epoch, global index) as a last item (`hpcdp.data.read.sample_keys`), for
  augmentation keyed by the sample; validation batches never do.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from hpcdp.config import LIBRARIES, ConfigError, TaskSection, find_task
from hpcdp.data.read.protocol import ReadOptions, TrainingReader, ValidationReader

if TYPE_CHECKING:
    import torch

    from hpcdp.config import Config


@dataclass(frozen=True)
class Dataset:
    """One HDF5 dataset a task reads from every split's file (samples first)."""

    name: str  # the dataset's name in the file
    role: str  # what it is to the task: "input", "label", "tokens", ...
    kinds: str = "biufc"  # numpy dtype kinds accepted ("iub": integers only)


@dataclass(frozen=True)
class Metric:
    """A number reported for training windows and validation, and how ranks combine it.

    reduce = "mean": `measure` returns this batch's sum; reported: the sum over
    every rank and batch divided by the summed `count`. "sum": reported as the
    total. "gather": `measure` returns per-sample rows (a tensor, first dimension
    the samples); every rank's rows are gathered and `finish(rows)` computes the
    value once over all of them (AUC, which is no mean of per-rank AUCs).
    """

    name: str
    reduce: Literal["mean", "sum", "gather"] = "mean"
    finish: Callable[[torch.Tensor], float] | None = None
    in_training: bool = True  # also reported for training windows (gathers can be costly)
    in_validation: bool = True  # also reported for validation (not for training-only costs)

    def __post_init__(self) -> None:
        if self.reduce == "gather" and self.finish is None:
            raise ValueError(f"metric {self.name!r}: a gathered metric needs `finish`")


def _first_len(targets: Any) -> int:
    return len(targets)


def _nothing(values: Mapping[str, Any]) -> dict[str, float]:
    return {}


def _never(cfg: Config) -> bool:
    return False


def _no_rates(cfg: Config, model: torch.nn.Module, samples_per_s: float, ranks: int,
              device: torch.device) -> dict[str, float]:
    return {}


@dataclass(frozen=True)
class Task:
    """Everything a workload supplies to the shared trainer (see the module doc)."""

    name: str
    models: tuple[str, ...]
    datasets: Callable[[Config], Sequence[Dataset]]
    build_model: Callable[[Config, tuple[int, ...]], torch.nn.Module]
    prepare: Callable[[Any, Config, torch.device], tuple[Any, Any]]
    loss: Callable[[Any, Any], torch.Tensor]
    measure: Callable[[Any, Any, torch.Tensor], Mapping[str, torch.Tensor]]
    metrics: tuple[Metric, ...]
    optimizers: Callable[[Config, torch.nn.Module], list[torch.optim.Optimizer]]
    count: Callable[[Any], int] = _first_len
    check_file: Callable[[Config, Path], None] | None = None
    from_data: Callable[[Config, Path], Config] | None = None
    defaults: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    section: TaskSection | None = None
    readers: Callable[[Config, int, int, int, torch.device],
                      tuple[TrainingReader, ValidationReader]] | None = None
    validation_reader: Callable[[Config, Path, int, int, int], ValidationReader] | None = None
    derive: Callable[[Mapping[str, Any]], dict[str, float]] = _nothing
    rates: Callable[[Config, torch.nn.Module, float, int, torch.device],
                    dict[str, float]] = _no_rates
    sample_keys: Callable[[Config], bool] = _never
    # The kinds of named network (model.name with a colon: hpcdp.models.named) the task's
    # build_model takes: "torchvision", "timm", "transformers", "builder" (the user's).
    named: tuple[str, ...] = ()

    def check_model(self, name: str) -> None:
        """Raise ConfigError naming the choices when the task has no model `name`; for a
        builder of the user's, when its module or file or its callable cannot be found."""
        if ":" in name:
            prefix = name.partition(":")[0]
            kind = prefix if prefix in LIBRARIES else "builder"
            if kind not in self.named:
                takes = ", ".join(f"{k}:" if k != "builder" else "package.module:callable"
                                  for k in self.named) or "none"
                raise ConfigError(f"model.name={name!r}: task {self.name!r} builds no {kind} "
                                  f"network (named networks it takes: {takes})")
            if kind == "builder":  # its module and callable found now, before any rank starts
                from hpcdp.models import named  # imports torch: only for a user's builder

                named.builder_of(name, named.parse(name))
            return
        if name not in self.models:
            raise ConfigError(f"unknown model {name!r} for task {self.name!r}; "
                             f"choose one of {', '.join(self.models)}")


def get(name: str) -> Task:
    """The task `name` (a built-in's name, an installed one's, or a reference to the
    user's own: config.find_task, which also checks it is a Task)."""
    task = find_task(name)
    if not isinstance(task, Task):  # pragma: no cover - find_task refuses it first
        raise ConfigError(f"task.name={name!r} is a {type(task).__name__}, not a Task")
    return task


def read_options(cfg: Config, batch: int, rank: int, size: int,
                 accumulation: int | None = None) -> ReadOptions:
    """How this rank reads its training share, from [run] and [data] (any task's reader).

    One read is one optimizer step of this rank: `batch` x `accumulation` rows (by
    default horovod.backward_passes_per_step), which the trainer cuts into that many
    micro-batches (hpcdp.train.step.micro_batches). Rank r's rows are its streams in
    order, so with virtual shards a multiple of ranks x accumulation (the default),
    micro-batch m holds what rank r*k+m of k times as many ranks reads in one step:
    the same samples meet the same kernels on 1 rank accumulating 2 as on 2 ranks.
    """
    from hpcdp.data.read.order import default_virtual_shards  # numpy: not for `hpcdp slurm`

    k = cfg.horovod.backward_passes_per_step if accumulation is None else accumulation
    shards = cfg.data.virtual_shards or (
        default_virtual_shards(batch * k * size, size * k) if k > 1 else None)
    return ReadOptions(batch_size=batch * k, rank=rank, world_size=size, seed=cfg.run.seed,
                       window_samples=cfg.data.window_samples or None,
                       virtual_shards=shards, prefetch=cfg.data.prefetch)


def defaults(name: str) -> Mapping[str, Mapping[str, Any]]:
    """The task's own config defaults (for config.build)."""
    return get(name).defaults


def optimizer_for(cfg: Config, params: Any) -> torch.optim.Optimizer:
    """The optimizer [optim] describes, over `params` as given (tensors or parameter groups).

    A task with a model at hand uses `default_optimizers` or `hpcdp.optim.build.optimizer`,
    which group the parameters for weight decay and trust ratios."""
    from hpcdp.optim import build  # torch at call time: `hpcdp slurm` reads task defaults

    return build.from_groups(cfg, params)


def default_optimizers(cfg: Config, model: torch.nn.Module) -> list[torch.optim.Optimizer]:
    """One optimizer over every parameter, as [optim] describes it, biases, norms and
    embeddings undecayed (hpcdp.optim.groups)."""
    from hpcdp.optim import build  # torch at call time: `hpcdp slurm` reads task defaults

    return [build.optimizer(cfg, model)]


def fusable(choice: str, params: list[Any]) -> bool | None:
    """hpcdp.optim.build.fusable (kept here for callers of the tasks' API)."""
    from hpcdp.optim import build  # torch at call time: `hpcdp slurm` reads task defaults

    return build.fusable(choice, params)
