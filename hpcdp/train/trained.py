"""A trained model from a run folder or a checkpoint file, read the way resume reads it.

The checkpoint is read with the resume rules (hpcdp.train.checkpoint_trust and
checkpoint_format): who could have written the file and its folder, the checksum,
and a weights-only load that runs no code. The network is rebuilt from the
checkpoint alone (hpcdp.models.spec: the vocabulary, tables and input channels come from the
weights; any other model by its task's builder from the recorded config and sample
shape, hpcdp.tasks.rebuild), so neither the training data nor its folder is needed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hpcdp import config as cfgmod
from hpcdp import tasks
from hpcdp.config import Config, ConfigError
from hpcdp.models import spec as specs
from hpcdp.tasks import rebuild
from hpcdp.train import checkpoint_folder as ckfolder
from hpcdp.train import checkpoint_format as ckformat
from hpcdp.train import checkpoint_trust as cktrust


@dataclass
class Trained:
    """A verified checkpoint's model and what it says about itself."""

    path: Path
    state: dict[str, Any]  # the decoded checkpoint (optimizer state and all)
    spec: dict[str, Any]  # hpcdp.models.spec, or a builder entry (hpcdp.tasks.rebuild)
    model: torch.nn.Module  # on the CPU, in eval mode

    @property
    def task(self) -> str:
        return str(self.state.get("task", "image"))

    @property
    def config(self) -> dict[str, Any]:
        return dict(self.state.get("config") or {})


def run_config(run_dir: Path, overrides: Sequence[str] = ()) -> Config:
    """The effective config a run wrote (run_dir/config.toml), with `overrides`."""
    path = run_dir / "config.toml"
    if not path.is_file():
        raise ConfigError(f"{run_dir}: no config.toml: not a run folder (or the run never "
                          "started); name a checkpoint file instead")
    return cfgmod.build(path, overrides, tasks.defaults)


def checkpoint_of(source: Path, trust: cktrust.Trust) -> Path:
    """The checkpoint file `source` names: itself, or a run folder's newest that verifies."""
    if not source.is_dir():
        if not source.exists():
            raise ckformat.CheckpointError(f"{source}: no such file or folder")
        return source
    folder = run_config(source).checkpoint_dir if (source / "config.toml").is_file() \
        else source
    found = ckfolder.find_latest(folder, trust)
    if found is None:
        raise ckformat.CheckpointError(f"{source}: no checkpoint that verifies in {folder}")
    return found.path


def load(source: Path, trust: cktrust.Trust | None = None) -> Trained:
    """The model of a run folder's newest checkpoint, or of a checkpoint file.

    Raises CheckpointError (also UntrustedError) as a resume would, and SpecError
    when the weights do not make the model the checkpoint's config names.
    """
    trust = trust or cktrust.Trust()
    path = checkpoint_of(source, trust)
    state = ckformat.decode(cktrust.read_verified(path, trust), str(path))
    weights = state.get("model")
    if not isinstance(weights, dict):
        raise ckformat.CheckpointError(f"{path}: holds no model state")
    spec = rebuild.describe(str(state.get("task", "image")), str(state.get("model_name")),
                            state.get("config") or {}, weights, state.get("sample_shape"))
    net = rebuild.build(spec)
    specs.load_weights(net, weights, str(path))
    return Trained(path, state, spec, net.eval())
