"""The loop LARS and LAMB share: every parameter with a gradient, one update each.

A subclass names itself (`name`, for the error) and writes `_update(p, g, group)`,
its rule for one tensor; the closure, the no-grad step and the refusal of sparse
gradients (an embedding table belongs to the task's sparse optimizer) are here once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


class Layerwise(torch.optim.Optimizer):
    """A per-tensor update rule over dense gradients (see the module doc)."""

    name = "layerwise"

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError(f"{self.name} takes dense gradients only (a sparse "
                                       "embedding table belongs to the task's sparse optimizer)")
                self._update(p, p.grad, group)
        return loss

    def _update(self, p: torch.Tensor, g: torch.Tensor, group: dict) -> None:
        raise NotImplementedError
