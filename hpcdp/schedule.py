"""The learning rate as a plain function of the optimizer step.

Large-batch recipe of Goyal et al. (2017): the peak rate is the one-rank rate
times the number of ranks (and accumulation steps), reached by a linear warmup,
then decayed by a cosine or by steps. Pure arithmetic, so tests can call it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Schedule:
    """Everything the rate at a step depends on (all lengths in optimizer steps)."""

    base_lr: float
    scale: float = 1.0
    kind: str = "cosine"  # cosine | step | constant
    warmup_steps: int = 0
    warmup_start_factor: float = 0.0
    total_steps: int = 1
    min_factor: float = 0.0
    milestones: tuple[int, ...] = field(default_factory=tuple)
    gamma: float = 0.1

    @property
    def peak_lr(self) -> float:
        return self.base_lr * self.scale

    def lr(self, step: int) -> float:
        """The rate used for the update that follows `step` completed steps."""
        return lr_at(step, self)


def lr_at(step: int, s: Schedule) -> float:
    """Warmup from `warmup_start_factor * peak` to `peak`, then the chosen decay."""
    if step < 0:
        raise ValueError(f"step must not be negative, got {step}")
    peak = s.peak_lr
    if step < s.warmup_steps:
        frac = step / s.warmup_steps
        return peak * (s.warmup_start_factor + (1.0 - s.warmup_start_factor) * frac)
    if s.kind == "constant":
        return peak
    if s.kind == "step":
        drops = sum(1 for m in s.milestones if step >= m)
        return peak * s.gamma**drops
    if s.kind == "cosine":
        span = max(1, s.total_steps - s.warmup_steps)
        t = min(1.0, (step - s.warmup_steps) / span)
        factor = s.min_factor + (1.0 - s.min_factor) * 0.5 * (1.0 + math.cos(math.pi * t))
        return peak * factor
    raise ValueError(f"unknown schedule kind {s.kind!r}")


def lr_scale(world_size: int, accumulation: int, adasum: bool, enabled: bool = True) -> float:
    """How much the one-rank rate grows with the effective batch.

    Average: the batch grows by ranks x accumulation, so does the rate. Adasum
    combines gradients so that the rate needs no scaling with the ranks
    (Horovod's guidance for CPUs), only with local accumulation.
    """
    if not enabled:
        return 1.0
    return float((1 if adasum else world_size) * accumulation)


def from_epochs(
    base_lr: float,
    scale: float,
    kind: str,
    steps_per_epoch: int,
    epochs: int,
    warmup_epochs: float = 0.0,
    warmup_start_factor: float = 0.0,
    min_factor: float = 0.0,
    milestones: list[float] | tuple[float, ...] = (),
    gamma: float = 0.1,
) -> Schedule:
    """Build a schedule from lengths in epochs (how configs speak) for a given step rate."""
    if steps_per_epoch < 1:
        raise ValueError(f"steps_per_epoch must be at least 1, got {steps_per_epoch}")
    return Schedule(
        base_lr=base_lr,
        scale=scale,
        kind=kind,
        warmup_steps=round(warmup_epochs * steps_per_epoch),
        warmup_start_factor=warmup_start_factor,
        total_steps=epochs * steps_per_epoch,
        min_factor=min_factor,
        milestones=tuple(round(m * steps_per_epoch) for m in milestones),
        gamma=gamma,
    )


def set_lr(optimizer: object, lr: float) -> None:
    """Write the rate into every parameter group (works for torch and Horovod optimizers)."""
    for group in optimizer.param_groups:  # type: ignore[attr-defined]
        group["lr"] = lr
