"""LARS: momentum SGD with a layer-wise trust ratio (You, Gitman and Ginsburg, 2017).

For each parameter tensor w with gradient g in a group with "adapt" (a layer's
matrix or kernel, see hpcdp.optim.groups), weight decay b, trust coefficient eta,
momentum m and the schedule's rate lr:

    trust = eta * |w| / (|g| + b * |w|)      (1 where |w| or |g| is 0)
    v     = m * v + lr * trust * (g + b * w)
    w     = w - v

(|.| the L2 norm of the whole tensor), the paper's Algorithm 1 and MLPerf's ResNet-50
reference. A group without "adapt" (biases, norm layers) takes plain momentum SGD
with no decay: v = m * v + lr * g. The trust ratio is a tensor (no host sync on a
GPU), computed from the averaged gradient: every rank takes the same step.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from hpcdp.optim.layerwise import Layerwise


class LARS(Layerwise):
    """Layer-wise adaptive rate scaling over momentum SGD (see the module doc).

    Every hyperparameter has a default and lives in the parameter groups: Horovod's
    and hpcdp's distributed wrappers rebuild the optimizer from its groups alone.
    """

    name = "LARS"

    def __init__(self, params: Iterable[Any], lr: float = 0.1, momentum: float = 0.9,
                 weight_decay: float = 0.0, trust_coefficient: float = 0.001,
                 adapt: bool = True) -> None:
        if lr < 0 or momentum < 0 or weight_decay < 0 or trust_coefficient <= 0:
            raise ValueError(f"LARS: lr={lr}, momentum={momentum}, weight_decay={weight_decay} "
                             f"must not be negative, trust_coefficient={trust_coefficient} "
                             "must be positive")
        super().__init__(params, {"lr": lr, "momentum": momentum, "weight_decay": weight_decay,
                                  "trust_coefficient": trust_coefficient, "adapt": adapt})

    def _update(self, p: torch.Tensor, g: torch.Tensor, group: dict) -> None:
        lr, wd = group["lr"], group["weight_decay"]
        if group["adapt"]:
            w_norm = torch.linalg.vector_norm(p)
            g_norm = torch.linalg.vector_norm(g)
            ratio = group["trust_coefficient"] * w_norm / (g_norm + wd * w_norm)
            trust = torch.where((w_norm > 0) & (g_norm > 0), ratio, torch.ones_like(ratio))
            d = g.add(p, alpha=wd) if wd else g.clone()
            d.mul_(trust * lr)
        else:
            d = g.mul(lr)
        state = self.state[p]
        if "momentum_buffer" not in state:
            state["momentum_buffer"] = d
        else:
            state["momentum_buffer"].mul_(group["momentum"]).add_(d)
        p.sub_(state["momentum_buffer"])
