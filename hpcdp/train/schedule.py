"""The learning rate as a plain function of the optimizer step.

The peak rate follows the batch of one update, never the number of ranks:
`optim.lr` is stated for `optim.ref_batch` samples and scaled to the global
batch by a rule (linear, Goyal et al. 2017; square root, common for Adam-type
optimizers; or none), so the same global batch trains alike on 1 or 64 ranks.
It is reached by a linear warmup, then decayed by a cosine, a polynomial (LARS's and
LAMB's usual decay, power 2 and 1 in MLPerf's ResNet-50 and BERT) or by steps. Pure
arithmetic, so tests can call it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Schedule:
    """Everything the rate at a step depends on (all lengths in optimizer steps)."""

    base_lr: float
    scale: float = 1.0  # lr_scale(rule, batch, ref_batch): peak = base_lr x scale
    rule: str = "none"  # recorded so that a resume can tell a change (see lr_change_on_resume)
    batch: int = 0  # samples per update that the rule followed
    ref_batch: int = 0  # the batch base_lr is stated for
    kind: str = "cosine"  # cosine | polynomial | step | constant
    warmup_steps: int = 0
    warmup_start_factor: float = 0.0
    total_steps: int = 1
    min_factor: float = 0.0
    milestones: tuple[int, ...] = field(default_factory=tuple)
    gamma: float = 0.1
    power: float = 2.0  # polynomial: (1 - progress)^power

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
    if s.kind == "polynomial":
        span = max(1, s.total_steps - s.warmup_steps)
        t = min(1.0, (step - s.warmup_steps) / span)
        return peak * (s.min_factor + (1.0 - s.min_factor) * (1.0 - t) ** s.power)
    raise ValueError(f"unknown schedule kind {s.kind!r}")


LR_RULES = ("linear", "sqrt", "none")


def update_batch(per_rank_batch: int, world_size: int, accumulation: int, adasum: bool) -> int:
    """The batch whose size the learning-rate rule follows.

    Averaged gradients: the global batch of one update (per-rank batch x ranks x
    accumulation steps). Adasum combines the ranks' updates so that the rate needs
    no scaling with the ranks (Horovod's guidance), so it follows one rank's
    update batch (per-rank batch x accumulation steps).
    """
    return per_rank_batch * accumulation * (1 if adasum else world_size)


def lr_scale(rule: str, batch: int, ref_batch: int) -> float:
    """How much `optim.lr`, stated for `ref_batch` samples, grows for `batch` samples."""
    if batch < 1 or ref_batch < 1:
        raise ValueError(f"batch sizes must be positive, got {batch} and {ref_batch}")
    if rule == "none":
        return 1.0
    if rule == "linear":
        return batch / ref_batch
    if rule == "sqrt":
        return math.sqrt(batch / ref_batch)
    raise ValueError(f"unknown learning-rate rule {rule!r}; choose one of {', '.join(LR_RULES)}")


def lr_change_on_resume(saved: dict, now: Schedule) -> str | None:
    """Why resuming `saved` (a checkpoint's schedule) with `now` would change the peak rate.

    None when the peak rate, the rule and the update batch all match (pure). A
    checkpoint from before the rule was recorded carries no batch or rule: only
    its peak rate is compared.
    """
    saved_peak = float(saved.get("base_lr", 0.0)) * float(saved.get("scale", 1.0))
    diffs = []
    for key, label in (("batch", "update batch"), ("rule", "rule"), ("ref_batch", "ref batch")):
        if key in saved and saved[key] != getattr(now, key):
            diffs.append(f"{label} {saved[key]} -> {getattr(now, key)}")
    if not math.isclose(saved_peak, now.peak_lr, rel_tol=1e-9):
        diffs.append(f"peak lr {saved_peak:g} -> {now.peak_lr:g}")
    if not diffs:
        return None
    return ("the checkpoint was trained with another learning rate than this run would use ("
            + ", ".join(diffs) + "); keep data.global_batch_size and the optim settings of "
            "the checkpoint's config, or set optim.allow_lr_change=true to resume anyway")


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
    power: float = 2.0,
    rule: str = "none",
    batch: int = 0,
    ref_batch: int = 0,
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
        power=power,
        rule=rule,
        batch=batch,
        ref_batch=ref_batch,
    )


def set_lr(optimizer: object, lr: float) -> None:
    """Write the rate into every parameter group (works for torch and Horovod optimizers).

    A group with an "lr_scale" entry takes that multiple of the rate: a task with
    several optimizers (embedding tables beside MLPs) keeps their ratio on one schedule.
    """
    for group in optimizer.param_groups:  # type: ignore[attr-defined]
        group["lr"] = lr * group.get("lr_scale", 1.0)
