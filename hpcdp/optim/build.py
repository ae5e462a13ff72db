"""The optimizer [optim] names, over a model's parameters in their decay groups.

One builder for every task, a user's own included: the task says which
parameters (all of them, or the dense ones beside a sparse optimizer of
embedding tables), this module says how they are grouped and stepped.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from hpcdp.config import Config
from hpcdp.optim.groups import param_groups
from hpcdp.optim.lamb import LAMB
from hpcdp.optim.lars import LARS

#: Optimizers whose groups carry "adapt" (the layer-wise trust ratio).
ADAPTIVE = ("lars", "lamb")


def optimizer(cfg: Config, model: torch.nn.Module,
              params: Iterable[torch.Tensor] | None = None) -> torch.optim.Optimizer:
    """optim.name over `params` (default: all of `model`'s), biases, norms and
    embeddings undecayed (hpcdp.optim.groups)."""
    o = cfg.optim
    groups = param_groups(model, o.weight_decay, o.name in ADAPTIVE, params)
    return from_groups(cfg, groups)


def from_groups(cfg: Config, params: Any) -> torch.optim.Optimizer:
    """optim.name over `params` as given (tensors, or groups with their own settings)."""
    o = cfg.optim
    params = list(params)
    if o.name == "lars":
        return LARS(params, lr=o.lr, momentum=o.momentum, weight_decay=o.weight_decay,
                    trust_coefficient=o.trust_coefficient)
    if o.name == "lamb":
        return LAMB(params, lr=o.lr, betas=(o.betas[0], o.betas[1]), weight_decay=o.weight_decay)
    fused = fusable(o.fused, params)
    if o.name == "sgd":
        return torch.optim.SGD(params, lr=o.lr, momentum=o.momentum,
                               nesterov=o.nesterov and o.momentum > 0,
                               weight_decay=o.weight_decay, fused=fused)
    if o.name == "adamw":
        return torch.optim.AdamW(params, lr=o.lr, weight_decay=o.weight_decay,
                                 betas=(o.betas[0], o.betas[1]), fused=fused)
    raise ValueError(f"unknown optimizer {o.name!r}")


def fusable(choice: str, params: list[Any]) -> bool | None:
    """True where optim.fused allows torch's fused SGD/AdamW kernel and it takes `params`:
    dense floating-point tensors, all on one CPU or CUDA device. None: torch's default.

    The fused kernel updates every parameter in one pass; torch's default on CPUs is
    a Python loop over the parameters, which costs a few percent of a small model's
    step (docs/benchmarks.md).
    """
    if choice == "off":
        return None
    tensors = [t for p in params for t in (p["params"] if isinstance(p, dict) else [p])]
    devices = {(t.device.type, t.device.index) for t in tensors}
    ok = (bool(tensors) and len(devices) == 1 and next(iter(devices))[0] in ("cpu", "cuda")
          and all(t.is_floating_point() and t.layout == torch.strided for t in tensors))
    return True if ok else None
