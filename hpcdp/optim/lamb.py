"""LAMB: Adam with a layer-wise trust ratio (You et al. 2019, Algorithm 2).

For each parameter tensor x with gradient g at step t (counted from 1), in a group
with "adapt" (a layer's matrix or embedding, see hpcdp.optim.groups), decoupled
weight decay b, the schedule's rate lr and betas (b1, b2):

    m = b1 * m + (1 - b1) * g            v = b2 * v + (1 - b2) * g * g
    r = (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
    u = r + b * x
    x = x - lr * (|x| / |u|) * u          (the ratio is 1 where |x| or |u| is 0)

(|.| the L2 norm of the whole tensor; the paper's scaling function phi is the
identity). A group without "adapt" (biases, norm layers) takes the Adam step with
no decay: x = x - lr * r. Every rank computes the same step from the averaged
gradient; the step count and both moments are the optimizer's state (checkpointed).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from hpcdp.optim.layerwise import Layerwise


class LAMB(Layerwise):
    """Layer-wise adaptive moments for large batches (see the module doc).

    Every hyperparameter has a default and lives in the parameter groups: Horovod's
    and hpcdp's distributed wrappers rebuild the optimizer from its groups alone.
    """

    name = "LAMB"

    def __init__(self, params: Iterable[Any], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6,
                 weight_decay: float = 0.0, adapt: bool = True) -> None:
        if lr < 0 or weight_decay < 0 or eps <= 0 or not all(0 <= b < 1 for b in betas):
            raise ValueError(f"LAMB: lr={lr} and weight_decay={weight_decay} must not be "
                             f"negative, eps={eps} must be positive, betas={betas} in [0, 1)")
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "eps": eps,
                                  "weight_decay": weight_decay, "adapt": adapt})

    def _update(self, p: torch.Tensor, g: torch.Tensor, group: dict) -> None:
        state = self.state[p]
        if not state:
            state["step"] = 0
            state["exp_avg"] = torch.zeros_like(p)
            state["exp_avg_sq"] = torch.zeros_like(p)
        state["step"] += 1
        t, (b1, b2) = state["step"], group["betas"]
        m, v = state["exp_avg"], state["exp_avg_sq"]
        m.mul_(b1).add_(g, alpha=1 - b1)
        v.mul_(b2).addcmul_(g, g, value=1 - b2)
        denom = (v / (1 - b2**t)).sqrt_().add_(group["eps"])
        u = (m / (1 - b1**t)).div_(denom)
        if group["adapt"]:
            if group["weight_decay"]:
                u.add_(p, alpha=group["weight_decay"])
            x_norm = torch.linalg.vector_norm(p)
            u_norm = torch.linalg.vector_norm(u)
            trust = torch.where((x_norm > 0) & (u_norm > 0), x_norm / u_norm,
                                torch.ones_like(x_norm))
            u.mul_(trust)
        p.sub_(u.mul_(group["lr"]))
