"""An optimizer that averages gradients over ranks with PowerSGD (hpcdp.runtime.powersgd).

`compressed(optimizer, ...)` returns an optimizer with the interface hpcdp's loop uses
of Horovod's DistributedOptimizer (`synchronize()`, `skip_synchronize()`, `step()`),
a subclass of the optimizer's class over the same parameter groups, as
hpcdp.runtime.grad_buckets builds its own. Nothing happens during backward: the
gradients accumulate in `.grad` over the step's backward passes as on one rank, and
`synchronize()` then makes, in the same order on every rank:

- in the first `warmup_steps` steps, one all-reduce of every gradient in one flat
  buffer (uncompressed, as the paper starts);
- afterwards, one all-reduce of every P factor and every tensor sent whole, then
  one of every Q factor (`Codec` holds both buffers).

Only Horovod's plain in-place all-reduce (Sum) of float tensors is used, which every
Horovod build has; the mean is the sum divided by the number of ranks, as the
uncompressed paths compute it.
"""

from __future__ import annotations

from typing import Any

import torch

from hpcdp.runtime import grad_buckets
from hpcdp.runtime.powersgd import Codec


class _PowerSGD:
    """Methods mixed into a subclass of the wrapped optimizer's class (see `compressed`)."""

    def __init__(self, params: Any, rank: int, warmup_steps: int, min_elements: int,
                 seed: int) -> None:
        super(self.__class__, self).__init__(params)  # type: ignore[call-arg]
        import horovod.torch as hvd

        self._hvd = hvd
        seen: set[int] = set()
        ordered = []
        for group in self.param_groups:  # type: ignore[attr-defined]
            for p in group["params"]:
                if p.requires_grad and id(p) not in seen:
                    seen.add(id(p))
                    ordered.append(p)
        if not ordered:
            raise ValueError("the optimizer has no parameters that require gradients")
        kinds = {(p.dtype, p.device) for p in ordered}
        if len(kinds) != 1:
            raise ValueError(f"parameters of several dtypes or devices: {sorted(map(str, kinds))}")
        self._params = ordered
        self._warmup = warmup_steps
        self.codec = Codec([tuple(p.shape) for p in ordered], rank, min_elements, hvd.size(),
                           ordered[0].device, ordered[0].dtype, seed)
        self._skip_sync = False
        self._window = [0, 0]  # bytes handed to all-reduces, steps, since `take_window`

    def _grads(self) -> list[torch.Tensor]:
        """Every parameter's gradient, zeros where backward gave none (as Horovod does)."""
        grads = []
        for p in self._params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            elif p.grad.is_sparse:
                raise RuntimeError(f"a parameter of shape {tuple(p.shape)} has a sparse "
                                   "gradient, which PowerSGD cannot compress")
            grads.append(p.grad)
        return grads

    def _sum_(self, t: torch.Tensor, name: str) -> None:
        """Collective: the sum over ranks of `t`, in place; its bytes counted as sent."""
        self._window[0] += t.numel() * t.element_size()
        self._hvd.allreduce_(t, op=self._hvd.Sum, name=name)

    @property
    def warming_up(self) -> bool:
        return self.codec.steps < self._warmup

    def synchronize(self) -> None:
        """Collective: average the step's gradients over ranks, in place in `.grad`."""
        grads = self._grads()
        if self.warming_up:
            flat = torch.cat([g.reshape(-1) for g in grads])
            self._sum_(flat, "hpcdp.powersgd.whole")
            flat.div_(self.codec.world)
            at = 0
            for g in grads:
                g.copy_(flat[at:at + g.numel()].view_as(g))
                at += g.numel()
        else:
            p_flat = self.codec.compose(grads)
            self._sum_(p_flat, "hpcdp.powersgd.p")
            q_flat = self.codec.project()
            if q_flat.numel():  # no tensor compressed: the same on every rank
                self._sum_(q_flat, "hpcdp.powersgd.q")
            self.codec.expand(grads)
        self.codec.steps += 1
        self._window[1] += 1

    def take_window(self) -> tuple[int, int]:
        """(bytes handed to the all-reduces, steps) since the last call; starts a new count."""
        window, self._window = tuple(self._window), [0, 0]
        return window  # type: ignore[return-value]

    def compression_state(self) -> dict[str, Any]:
        """This rank's PowerSGD state for a checkpoint (residuals are per rank)."""
        return self.codec.state_dict()

    def load_compression_state(self, state: dict[str, Any], residuals: bool) -> str | None:
        return self.codec.load_state_dict(state, residuals)


def compressed(optimizer: torch.optim.Optimizer, rank: int, warmup_steps: int,
               min_elements: int, seed: int = 0) -> torch.optim.Optimizer:
    """`optimizer`'s class and parameter groups, with gradients averaged by PowerSGD at
    `rank` after `warmup_steps` uncompressed steps; tensors under `min_elements`
    elements go whole. Raises ValueError where the parameters cannot share one flat
    buffer (several dtypes or devices)."""
    if warmup_steps < 0:
        raise ValueError(f"warm-up steps must not be negative, got {warmup_steps}")
    cls = grad_buckets.subclass_of(optimizer, grad_buckets.SyncOnStep, _PowerSGD)
    return cls(optimizer.param_groups, rank, warmup_steps, min_elements, seed)  # type: ignore[call-arg]
