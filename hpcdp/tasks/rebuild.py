"""A trained network rebuilt without its data: by its spec, or by its task's builder.

hpcdp's own networks (hpcdp.models.spec.has_spec) are described by a spec, the numbers
their constructors take. Every other model (a user's task, a named network of a built-in
task) is described by how it was built: a *builder entry*

    {"builder": "task", "task": <task.name as the run recorded it>, "name": <model.name>,
     "sample_shape": [...], "config": <the run's whole config>}

and rebuilt the way training built it: the task found by its name or reference
(hpcdp.config.find_task, which imports the user's module), the config rebuilt from the
record (hpcdp.config.from_record: keys and types checked, no paths), then
`task.build_model(cfg, sample_shape)`. The same path serves every such model, so a task
adds nothing here. A builder must depend on its config and sample shape alone, never
on a data file: what it takes from the data is in the recorded config (`from_data`).

No Horovod, MPI or HDF5 is imported here; what the task's own module imports is the
task's. Every failure is a `SpecError` naming the builder.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from hpcdp import config as cfgmod
from hpcdp import tasks
from hpcdp.config import Config, ConfigError
from hpcdp.models import spec as specs
from hpcdp.models.spec import SpecError

BUILDER = "task"


def is_builder(model: Mapping[str, Any]) -> bool:
    """Whether a model entry is a builder entry (else an hpcdp network's spec)."""
    return model.get("builder") == BUILDER


def describe(task: str, model_name: str, config: Mapping[str, Any],
             state: Mapping[str, torch.Tensor], sample_shape: Sequence[int] | None
             ) -> dict[str, Any]:
    """The model entry of a checkpoint: its spec for an hpcdp network, else its builder."""
    if specs.has_spec(task, model_name):
        return specs.from_checkpoint(task, model_name, config, state)
    if not sample_shape:
        raise SpecError(f"model {model_name!r} of task {task!r} is rebuilt by its task, from "
                        "the sample shape it was built for, and the checkpoint records none "
                        "(written before hpcdp recorded it): resume it once to write a new one")
    return {"builder": BUILDER, "task": task, "name": model_name,
            "sample_shape": [int(d) for d in sample_shape], "config": dict(config)}


def config_of(model: Mapping[str, Any]) -> Config:
    """The config a builder entry records, as a Config (its task imported to check it)."""
    task, record = model.get("task"), model.get("config")
    if not isinstance(task, str) or not isinstance(record, Mapping):
        raise SpecError(f"a builder entry needs 'task' (a name) and 'config' (an object), "
                        f"got task {task!r}")
    record = {**record, "task": {**(record.get("task") or {}), "name": task}}
    try:
        cfgmod.find_task(task)
    except ConfigError as e:
        raise SpecError(f"the model's builder, task {task!r}, cannot be imported: {e}") from None
    try:
        return cfgmod.from_record(record, f"the config recorded for task {task!r}")
    except ConfigError as e:
        raise SpecError(f"the model's builder, task {task!r}, refuses its recorded config: "
                        f"{e}") from None


def build(model: Mapping[str, Any]) -> torch.nn.Module:
    """The network a model entry describes, on the CPU (or the current default device),
    with fresh weights (hpcdp.models.spec.load_weights next)."""
    if not is_builder(model):
        return specs.build(model)
    cfg, shape = config_of(model), model.get("sample_shape")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d > 0 for d in shape):
        raise SpecError(f"a builder entry's sample_shape must be a list of sizes, got {shape!r}")
    task = tasks.get(cfg.task.name)
    try:
        net = task.build_model(cfg, tuple(shape))
    except Exception as e:  # noqa: BLE001 - the builder is the user's code
        raise SpecError(f"the model's builder, task {cfg.task.name!r}, failed for model "
                        f"{cfg.model.name!r}: {type(e).__name__}: {e}") from None
    if not isinstance(net, torch.nn.Module):
        raise SpecError(f"the model's builder, task {cfg.task.name!r}, returned a "
                        f"{type(net).__name__}, not a torch.nn.Module")
    return net
