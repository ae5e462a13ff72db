"""One optimizer step: forward, loss, backward over the accumulated batches, the update.

Also where the NaN policy (`run.on_nan`) is applied. The gradient all-reduces
run inside the optimizer wrappers (hooks during backward, then `synchronize()`);
the step's one collective of its own averages the BatchNorm running statistics
(hpcdp.train.norm_stats), so that every rank holds the same after every step.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any

import torch

from hpcdp.runtime import faults, watchdog
from hpcdp.train import schedule as sched
from hpcdp.train.accel import to_layout
from hpcdp.train.evaluate import MetricSums
from hpcdp.train.numerics import autocast, finite, nonfinite, parameters
from hpcdp.train.reporting import StepSplit
from hpcdp.train.setup import Run

log = logging.getLogger("hpcdp.train")

OnBatch = Callable[[Any, int], None]


def forward_backward(run: Run, inputs: Any, targets: Any, sums: MetricSums, nan: bool) -> None:
    """One prepared batch: the task's loss, scaled for accumulation, backward; metrics added."""
    watchdog.phase("forward")
    with autocast(run.cfg, run.device):
        out = run.model(inputs)
        loss = run.task.loss(out, targets)
        if nan:  # an injected fault (tests)
            loss = faults.poison(loss)
    scaled = loss / run.accum if run.accum > 1 else loss  # no extra node in the graph
    watchdog.phase("backward")
    (run.scaler.scale(scaled) if run.scaler is not None else scaled).backward()
    with torch.no_grad():
        sums.add(run.task.measure(out, targets, loss), run.task.count(targets))


def micro_batches(batch: Any, parts: int) -> list[Any]:
    """`batch` (tensors, possibly in tuples, lists or dicts, or None) cut along its rows
    into `parts` equal micro-batches, as views: micro-batch m is rows [m*b, (m+1)*b)."""
    if parts == 1:
        return [batch]
    if batch is None:
        return [None] * parts
    if isinstance(batch, torch.Tensor):
        rows = batch.shape[0] if batch.dim() else 0
        if rows == 0 or rows % parts:
            raise ValueError(f"a batch of {rows} rows cannot be cut into "
                             f"horovod.backward_passes_per_step={parts} equal micro-batches")
        return list(batch.split(rows // parts))
    if isinstance(batch, (tuple, list)):
        return [type(batch)(items) for items in zip(*(micro_batches(b, parts) for b in batch))]
    if isinstance(batch, dict):
        cut = {k: micro_batches(v, parts) for k, v in batch.items()}
        return [{k: v[m] for k, v in cut.items()} for m in range(parts)]
    raise TypeError(f"a training batch of type {type(batch).__name__} cannot be cut into "
                    f"horovod.backward_passes_per_step={parts} micro-batches: serve tensors, "
                    "or tuples, lists or dicts of them")


def train_step(run: Run, it: Iterator[Any], lr: float, sums: MetricSums, step: int,
               nan: bool = False, on_batch: OnBatch | None = None) -> StepSplit:
    """One optimizer step over one batch of `it`, in `accum` micro-batches; returns
    where its seconds went.

    Horovod all-reduces gradients during backward; `synchronize()` waits for what
    did not overlap (counted as communication), then the step runs without a
    second synchronization (the pattern Horovod documents for AMP and clipping).
    Horovod's Adasum optimizer (several ranks) instead steps inside its hooks.
    """
    t_data = t_compute = 0.0
    for opt in run.optimizers:
        opt.zero_grad()
        sched.set_lr(opt, lr)  # before backward: Adasum applies the local step in its hooks
    t0 = time.perf_counter()
    watchdog.phase("data")
    micro = micro_batches(next(it), run.accum)  # the step's rows, read at once
    for batch in micro:
        watchdog.phase("data")
        if on_batch is not None:
            on_batch(batch, step)
        # Data time ends with the batch on the device (the task's prepare), as a data
        # share of the step means: what the step waits for before it can compute.
        inputs, targets = run.task.prepare(batch, run.cfg, run.device)
        inputs = to_layout(inputs, run.channels_last)
        t1 = time.perf_counter()
        forward_backward(run, inputs, targets, sums, nan)
        t_data += t1 - t0
        t_compute += time.perf_counter() - t1
        t0 = time.perf_counter()
    t2 = time.perf_counter()
    watchdog.enter_collective("allreduce gradients")  # waits for what backward sent
    agree_stats = run.norm_stats.start() if run.norm_stats else None  # collective: BN stats
    if run.cfg.horovod.op == "adasum" and run.size > 1:
        for opt in run.optimizers:  # step() waits for the combined deltas and applies them
            opt.step()
        if not finite(p.data for p in parameters(run.model)):
            raise nonfinite(step, run.cfg, "weights after an Adasum step", can_skip=False)
        if agree_stats:
            agree_stats()
        return StepSplit(t_data, t_compute, time.perf_counter() - t2)
    if run.size > 1:  # one rank's optimizers are unwrapped (setup.distributed)
        for opt in run.optimizers:
            opt.synchronize()
    t3 = time.perf_counter()
    watchdog.phase("optimizer")
    update(run, step)
    t4 = time.perf_counter()
    if agree_stats:
        agree_stats()  # the averaged statistics in place before the next forward pass
    t5 = time.perf_counter()
    if run.device.type == "cuda":
        torch.cuda.synchronize(run.device)
    return StepSplit(t_data, t_compute + time.perf_counter() - t5, t3 - t2 + t5 - t4, t4 - t3)


def update(run: Run, step: int) -> None:
    """Apply the averaged gradients, unless they are not finite (run.on_nan decides).

    Gradients are averaged over ranks by now, so one rank's NaN is on every rank:
    each decides alike without another collective. (A GradScaler skips such steps.)
    """
    if run.cfg.optim.grad_clip > 0:
        norm = clip(run, run.cfg.optim.grad_clip)
        ok = run.scaler is not None or bool(torch.isfinite(norm))
    else:
        ok = run.scaler is not None or finite(
            p.grad for p in parameters(run.model) if p.grad is not None)
    if not ok:
        if run.cfg.run.on_nan == "stop":
            raise nonfinite(step, run.cfg, "loss or gradients", can_skip=True)
        log.warning(f"step {step}: non-finite loss or gradients on some rank; update skipped "
                    "(run.on_nan='skip')")
        return
    with ExitStack() as stack:
        for opt in run.optimizers:
            if run.size > 1:
                stack.enter_context(opt.skip_synchronize())
        for opt in run.optimizers:
            if run.scaler is not None:
                run.scaler.step(opt)
            else:
                opt.step()
        if run.scaler is not None:
            run.scaler.update()


def clip(run: Run, max_norm: float) -> torch.Tensor:
    """Scale the averaged gradients down to global L2 norm `max_norm`; returns the norm before.

    Called after `synchronize()`, so every rank clips the same averaged gradients
    by the same factor (clipping each rank's own gradients would not be what one
    process with the whole batch does). Under a GradScaler the gradients are
    unscaled first. The norm doubles as the finiteness check: NaN or inf in any
    gradient makes it non-finite.
    """
    if run.scaler is not None:
        for opt in run.optimizers:
            run.scaler.unscale_(opt)
    params = [p for p in parameters(run.model) if p.grad is not None]
    return torch.nn.utils.clip_grad_norm_(params, max_norm)
