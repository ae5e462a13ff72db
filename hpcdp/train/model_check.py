"""The data layout and the network, checked without Horovod: what set-up builds first.

`from_data` fills what the config leaves to the training file, `checked_layout` and
`check_kinds` read the file's layout and dtypes, `built_model` calls the task's
builder and checks that it gave a network. `check_user_builder` runs the builder of a
user's code (a task reference's build_model, a model.name builder or library) once on
the meta device before Horovod starts, so that a builder that raises or returns no
network fails on every rank before any collective, with the message set-up would give.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from hpcdp.config import Config, ConfigError
from hpcdp.tasks import Dataset, Task


def check_kinds(path: Path, wanted: list[Dataset]) -> None:
    """Each dataset the task reads has a dtype kind the task accepts."""
    from hpcdp.data.read.samples import ReaderError, open_h5

    with open_h5(str(path)) as f:
        for d in wanted:
            kind = f[d.name].dtype.kind if d.name in f else None
            if kind is not None and kind not in d.kinds:
                raise ReaderError(f"{path}: {d.role} dataset {d.name!r} has dtype "
                                  f"{f[d.name].dtype}, which this task cannot use")


def checked_layout(path: Path, names: list[str], min_samples: int = 1) -> Any:
    """The first dataset's layout; `ReaderError` if the datasets cannot be read together."""
    from hpcdp.data.read.multi_field import validate_fields
    from hpcdp.data.read.samples import validate_dataset

    if len(names) > 2:
        return validate_fields(str(path), names, min_samples)[0]
    return validate_dataset(path, names[0], names[1] if len(names) > 1 else None, min_samples)


def from_data(cfg: Config, task: Task) -> Config:
    """The config with what it leaves to the data (the task's `from_data`: image.num_classes
    = "auto") read from the training file, whose layout and dtypes are checked first."""
    if task.from_data is None:
        return cfg
    path, wanted = Path(cfg.data.path) / cfg.data.train_file, list(task.datasets(cfg))
    if task.readers is None:  # a task with its own readers checks its format itself
        checked_layout(path, [d.name for d in wanted])
        check_kinds(path, wanted)
    return task.from_data(cfg, path)


def built_model(cfg: Config, task: Task, sample_shape: tuple[int, ...]) -> torch.nn.Module:
    """`task.build_model(cfg, sample_shape)`, which must give a torch.nn.Module; any other
    failure of a task's builder (a user's code) is a ConfigError naming the task."""
    try:
        net = task.build_model(cfg, sample_shape)
    except ValueError:
        raise  # the task's own message about its config (ConfigError among them)
    except Exception as e:  # noqa: BLE001 - a user's builder may raise anything
        raise ConfigError(f"task.name={cfg.task.name!r}: its build_model failed for model "
                          f"{cfg.model.name!r}: {type(e).__name__}: {e}") from None
    if not isinstance(net, torch.nn.Module):
        raise ConfigError(f"task.name={cfg.task.name!r}: its build_model returned a "
                          f"{type(net).__name__}, not a torch.nn.Module")
    return net


def runs_user_code(cfg: Config, task: Task) -> bool:
    """Whether building the network runs code from outside hpcdp: the task's builder is
    not hpcdp's (a user's task), or model.name has a prefix (a library's or a user's
    builder, through the image task's)."""
    module = getattr(task.build_model, "__module__", None) or ""
    return not module.startswith("hpcdp.") or ":" in cfg.model.name


def check_user_builder(cfg: Config, task: Task) -> None:
    """A user's builder, run before Horovod on the sample shape of the training file.

    Shapes-only first (the meta device: no memory, no time); a builder that cannot run
    shapes-only (it computes on its tensors) is run for real on the CPU, and only what
    that raises counts. A file that cannot be read is left to set-up, which reports it
    from every rank alike. Raises ConfigError (or the task's ValueError) otherwise.
    """
    if task.readers is not None or not runs_user_code(cfg, task):
        return
    try:
        filled = from_data(cfg, task)
        names = [d.name for d in task.datasets(filled)]
        shape = tuple(checked_layout(Path(filled.data.path) / filled.data.train_file,
                                     names).sample_shape)
    except Exception:  # noqa: BLE001 - the data's own errors: set-up names them, agreed
        return
    try:
        with torch.device("meta"):
            built_model(filled, task, shape)
        return
    except Exception:  # noqa: BLE001 - judged by the real build below
        pass
    try:
        built_model(filled, task, shape)
    except ConfigError:
        raise
    except ValueError as e:  # the task's own message about its config
        raise ConfigError(str(e)) from None
