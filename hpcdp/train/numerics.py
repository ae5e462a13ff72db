"""Numerics every step and evaluation share: the precision context, the finite check,
the parameter list, and the error ranks raise together on NaN/inf."""

from __future__ import annotations

import math
import weakref
from collections.abc import Iterable
from contextlib import nullcontext
from typing import Any

import torch

from hpcdp.config import Config
from hpcdp.runtime.dist import AgreedError


def autocast(cfg: Config, device: torch.device) -> Any:
    if cfg.run.precision == "fp32":
        return nullcontext()
    dtype = torch.bfloat16 if cfg.run.precision == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


_PARAMETERS: weakref.WeakKeyDictionary[torch.nn.Module, list[torch.nn.Parameter]] = (
    weakref.WeakKeyDictionary())


def parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The model's parameters, listed once: walking the model's modules for them on
    every step is Python work that shows in a small model's step."""
    found = _PARAMETERS.get(model)
    if found is None:
        found = _PARAMETERS[model] = list(model.parameters())
    return found


def count_parameters(model: torch.nn.Module) -> int:
    """Every parameter's element count, for the run's opening line."""
    return sum(p.numel() for p in model.parameters())


def finite(tensors: Iterable[torch.Tensor]) -> bool:
    """Whether every value is finite: one sum per tensor, one device sync for all.

    NaN and inf survive a sum (inf - inf is NaN), so a finite total means finite
    values. A sum can also overflow, but only for values around 1e32 and up, as
    fatal to training as inf. Every tensor is summed in fp32: per step this is
    far cheaper than isfinite() on every value.
    """
    sums = [t.sum(dtype=torch.float32) for t in tensors]
    return math.isfinite(torch.stack(sums).sum().item()) if sums else True


def nonfinite(step: int, cfg: Config, what: str, can_skip: bool) -> Exception:
    """The error every rank raises together when training produced NaN/inf (no save)."""
    hint = " or set run.on_nan=skip to skip such updates" if can_skip else ""
    return AgreedError(
        f"step {step}: non-finite (NaN/inf) {what}; stopping without writing a checkpoint "
        f"(run.on_nan={cfg.run.on_nan!r}). The checkpoints in {cfg.checkpoint_dir} are "
        f"untouched: rerun to resume from the newest{hint}")
