"""`load(DIR)`: an exported model as an eval-mode torch module, and its config.

Imports torch, safetensors and hpcdp.models only: the model can be used where
Horovod, MPI and HDF5 are not installed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from hpcdp.export import bundle
from hpcdp.models import spec as specs


def model_from(config: dict[str, Any], tensors: dict[str, torch.Tensor], source: str
               ) -> torch.nn.Module:
    """The network config["model"] describes, holding `tensors`, in eval mode on the CPU."""
    try:
        net = specs.build(config["model"])
        specs.load_weights(net, tensors, source)
    except specs.SpecError as e:
        raise bundle.ExportError(f"{e} (config.json's model: {config['model']})") from None
    return net.eval()


def load(folder: str | Path, device: str | torch.device = "cpu"
         ) -> tuple[torch.nn.Module, dict[str, Any]]:
    """(model in eval mode on `device`, config.json as a dict) of an export folder.

    Raises ExportError naming the file and the problem: a weights file that is not
    the one config.json was written with (truncated, replaced), that is no
    safetensors file, or whose tensors do not fit the model config.json describes.
    """
    folder = Path(folder)
    config = bundle.read_config(folder)
    tensors = bundle.read_tensors(folder, config)
    net = model_from(config, tensors, str(folder / bundle.WEIGHTS))
    return net.to(device), config
