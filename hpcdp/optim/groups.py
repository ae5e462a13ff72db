"""Parameter groups for weight decay and trust ratios, decided from what each parameter is.

Three roles, from the modules that hold a parameter and its shape, never from
its name, so a model from torchvision, timm or transformers is grouped right:

- "weight": a matrix or kernel of a layer that multiplies (Linear, Conv, a tied
  output layer): decayed, and adapted by LARS/LAMB's trust ratio;
- "embedding": held only by Embedding/EmbeddingBag modules, or named by the model's
  own `no_weight_decay()` (timm's convention, e.g. position embeddings and class
  tokens): not decayed, still adapted (the papers adapt every layer's matrix);
- "fixed": biases, norm layers' scales and shifts, any tensor of one dimension
  or none (a custom RMSNorm's scale, a layer scale): neither decayed nor adapted,
  as in the LARS and LAMB papers and MLPerf's reference optimizers.

A weight tied between an embedding and an output layer (a GPT's token matrix)
multiplies, so it is a "weight".
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

ROLES = ("weight", "embedding", "fixed")

NORMS: tuple[type[nn.Module], ...] = (
    nn.modules.batchnorm._NormBase,  # BatchNorm*, SyncBatchNorm, InstanceNorm* (and subclasses)
    nn.LayerNorm, nn.GroupNorm, nn.RMSNorm, nn.LocalResponseNorm,
)
EMBEDDINGS: tuple[type[nn.Module], ...] = (nn.Embedding, nn.EmbeddingBag)


def roles(model: nn.Module) -> dict[int, str]:
    """id of every parameter of `model` -> its role (see the module doc)."""
    owners: dict[int, list[nn.Module]] = {}
    for module in model.modules():
        for p in module.parameters(recurse=False):
            owners.setdefault(id(p), []).append(module)
    names: dict[int, set[str]] = {}
    params: dict[int, torch.Tensor] = {}
    for name, p in model.named_parameters(remove_duplicate=False):  # a tied one: each name
        names.setdefault(id(p), set()).add(name)
        params[id(p)] = p
    declared = _declared_no_decay(model)
    return {key: _role(p, owners.get(key, []), bool(names[key] & declared))
            for key, p in params.items()}


def _role(p: torch.Tensor, owners: list[nn.Module], declared: bool) -> str:
    if p.dim() <= 1 or any(isinstance(m, NORMS) for m in owners):
        return "fixed"
    if declared or (owners and all(isinstance(m, EMBEDDINGS) for m in owners)):
        return "embedding"
    return "weight"


def _declared_no_decay(model: nn.Module) -> set[str]:
    """Parameter names the model itself exempts from decay (timm's `no_weight_decay()`)."""
    declare = getattr(model, "no_weight_decay", None)
    if not callable(declare):
        return set()
    names = declare()
    return {str(n) for n in names} if isinstance(names, Iterable) else set()


def param_groups(model: nn.Module, weight_decay: float, adaptive: bool,
                 params: Iterable[torch.Tensor] | None = None) -> list[dict]:
    """Groups over `params` (default: every trainable parameter of `model`), each with
    its "weight_decay" and, where `adaptive` (LARS, LAMB), "adapt" (the trust ratio).

    Groups that differ in nothing the optimizer reads are one group (SGD or AdamW
    with no decay: a single group, as before there were roles), and a group with no
    parameters is left out. The decayed group comes first; within a group the
    parameters keep the model's order, so the optimizer's state lines up run to run.
    """
    role_of = roles(model)
    chosen = list(model.parameters()) if params is None else list(params)
    grouped: dict[tuple, list[torch.Tensor]] = {}
    seen: set[int] = set()
    for p in chosen:
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        if id(p) not in role_of:
            raise ValueError(f"a parameter of shape {tuple(p.shape)} is not in the model")
        grouped.setdefault(_settings(role_of[id(p)], weight_decay, adaptive), []).append(p)
    ordered = sorted(grouped.items(), key=lambda kv: -kv[0][0][1])  # decayed first (stable)
    return [{"params": ps, **dict(key)} for key, ps in ordered]


def _settings(role: str, weight_decay: float, adaptive: bool) -> tuple:
    decay = weight_decay if role == "weight" else 0.0
    if not adaptive:
        return (("weight_decay", decay),)
    return (("weight_decay", decay), ("adapt", role != "fixed"))
