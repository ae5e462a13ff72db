"""One training run, from init to summary, in the order every rank follows.

1. Horovod init (signal handlers first: a signal during start-up must not kill
   a rank); pin a device; print the identity line.
2. Set up data, model, optimizers (hpcdp.train.setup, local); all ranks agree.
3. Resume (hpcdp.train.checkpoints: rank 0 chooses, broadcast, all load, agree),
   then broadcast parameters and optimizer state from rank 0.
4. The loop: each step is `train_step`; at its boundary the same collectives on
   every rank, each one named line below: metrics every `log.every_steps`, the
   preemption agreement, a checkpoint when due; validation at each epoch's end.
5. Summary (rank 0 writes summary.json), or a stop for preemption / stop_at_step.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

from hpcdp import config as cfgmod
from hpcdp.config import Config
from hpcdp.data.staging import collective as staging
from hpcdp.runtime import dist
from hpcdp.runtime.preempt import after_stop
from hpcdp.tasks import Task
from hpcdp.train import setup, startup, traffic
from hpcdp.train.checkpoints import CheckpointManager, TrainState, of_run
from hpcdp.train.evaluate import MetricSums, evaluate
from hpcdp.train.hooks import Hooks
from hpcdp.train.numerics import count_parameters
from hpcdp.train.reporting import (
    Reporter,
    StepTimes,
    rank_fields,
    rank_spread,
    setup_logging,
    spread_text,
)
from hpcdp.train.step import train_step
from hpcdp.train.tracking.hub import Trackers

log = logging.getLogger("hpcdp.train")


@dataclass
class Outcome:
    """How the loop ended, and what the summary needs."""

    stop: str | None = None  # "preempted", "stopped", or None for a finished run
    last_val: dict[str, Any] = field(default_factory=dict)
    samples: int = 0  # trained by this rank in this process
    excluded: float = 0.0  # seconds of validation and checkpoints, left out of throughput
    started: float = field(default_factory=time.perf_counter)


def train(cfg: Config, task: Task) -> int:
    """One run on this rank; returns the process exit code."""
    preempt = startup.begin(cfg)  # signal handlers, Horovod, logging, the watchdog
    with dist.abort_on_error():
        run = start(cfg, task)
        ckpts = CheckpointManager(run.cfg, run.root)  # the config as filled from the data
        state, resumed_from = ckpts.resume(of_run(run))         # collective: hpcdp.resume
        dist.broadcast_start(run.model, run.optimizers)         # collective: parameters
        rep = open_outputs(run, state, resumed_from)
        hooks = Hooks(cfg, run.rank, cfg.run_dir)
        outcome = loop(run, state, ckpts, hooks, preempt, rep)
        if preempt is not None:
            preempt.drain()  # the last check's all-reduce, so no collective is left open
        hooks.close()
        # The signal handlers stay until the process exits: a TERM that follows (Slurm
        # ends a requeued job that way) must not kill a rank that is finishing cleanly.
        code = 0
        if outcome.stop:
            code = report_stop(run, ckpts, state, outcome.stop, rep)  # collective: hpcdp.stop
        else:
            summarize(run, ckpts, state, outcome, resumed_from, rep)
        rep.close()
        return code  # readers stay open: see dist.shutdown_and_exit


def start(cfg: Config, task: Task) -> setup.Run:
    """Device, identity, placement check, local set-up; every rank agrees it worked."""
    rank, size = dist.rank(), dist.size()
    run: setup.Run | None = None
    device, error = startup.place(cfg)                         # collective: hpcdp.runtime.placement
    read_cfg = staging.stage(cfg, error is not None)           # collective: hpcdp.stage.*
    if error is None:
        try:
            # Everything from here on (readers, the task's own reads, config.toml) sees
            # data.path as read: this node's stage dir when the data was staged.
            run = setup.build(read_cfg, task, rank, size, device)
        except Exception as e:  # noqa: BLE001 - any setup failure is reported on all ranks
            error = str(e) if isinstance(e, ValueError) else f"{type(e).__name__}: {e}"
    dist.agree(error, "setup")                                  # collective: hpcdp.agree.setup
    assert run is not None
    mine = (run.train_reader.steps_per_epoch, staging.staging_node(os.environ),
            staging.read_paths(read_cfg))
    gathered = dist.allgather_object(mine, "hpcdp.steps")      # collective: hpcdp.steps
    uneven = setup.uneven_steps_error([steps for steps, _, _ in gathered])
    if uneven:
        raise dist.AgreedError(uneven)
    run.data_paths_read = {node: paths for _, node, paths in gathered}
    return run


def open_outputs(run: setup.Run, state: TrainState, resumed_from: str | None) -> Reporter:
    """From here on rank 0 writes the run folder: log file, config, metrics."""
    cfg, run_dir = run.cfg, run.cfg.run_dir
    if run.root:
        run_dir.mkdir(parents=True, exist_ok=True)
        setup_logging(run_dir, True)
        (run_dir / "config.toml").write_text(cfgmod.dumps(cfg))
    # Rank 0's trackers start in processes of their own now, and continue the run's
    # tracker runs on a resume (hpcdp.train.tracking).
    trackers = (Trackers.start(cfg, state.step if resumed_from else None, os.environ)
                if run.root else None)
    rep = Reporter(run_dir, run.root, cfg.log.jsonl, cfg.log.tensorboard, cfg.log.progress,
                   run.total_steps, state.step, drop_after=state.step if resumed_from else None,
                   trackers=trackers)
    rep.info(
        f"{'resumed from ' + resumed_from if resumed_from else 'fresh start'}: task "
        f"{cfg.task.name}, model {cfg.model.name} ({count_parameters(run.model):,} parameters) "
        f"on {run.size} rank(s), batch {run.batch}/rank x {run.accum} accumulation = "
        f"{run.global_batch} global, peak lr {run.schedule.peak_lr:g} "
        f"({setup.lr_rule_text(cfg, run.schedule.batch)}), {run.steps_per_epoch} "
        f"steps/epoch, {run.total_steps} steps, device {run.device}")
    if cfg.horovod.compression == "powersgd":
        rep.info(traffic.powersgd_text(traffic.per_step(run), run.size))
    return rep


def loop(run: setup.Run, state: TrainState, ckpts: CheckpointManager, hooks: Hooks,
         preempt: Any, rep: Reporter) -> Outcome:
    """Train until the last step, a stop or preemption; validate at each epoch's end."""
    cfg, reader, out = run.cfg, run.train_reader, Outcome()
    window, sums = StepTimes(), MetricSums(run.task.metrics, run.device, training=True)
    resume_window(sums, ckpts.metric_sums)
    carrier = flag_carrier(run.optimizers, run.size)
    run.model.train()
    while state.step < run.total_steps and out.stop is None:
        reader.set_epoch(state.epoch)  # keeps the position when a resumed state is for it
        hooks.epoch = state.epoch
        it = iter(reader)
        for _ in range(min(len(reader), run.total_steps - state.step)):
            lr = run.schedule.lr(state.step)
            nan = hooks.before_step(state.step)
            times = train_step(run, it, lr, sums, state.step, nan, hooks.on_batch)
            state.advance(run.global_batch)
            window.add(times, run.batch * run.accum)
            out.samples += run.batch * run.accum
            rep.advance(1)
            if state.step % cfg.log.every_steps == 0 or state.step == run.total_steps:
                report_window(run, rep, window, sums, state, lr)  # collective: train metrics
                window = StepTimes()
            t0 = time.perf_counter()
            out.stop = agree_stop(preempt, hooks, state.step, carrier)  # hpcdp.runtime.preempt
            window.comm += time.perf_counter() - t0
            if ckpts.due(state.step, run.total_steps, out.stop is not None):
                t0 = time.perf_counter()
                save(ckpts, run, state, rep, sums)                # collective: hpcdp.rng, save
                out.excluded += window.exclude(time.perf_counter() - t0, checkpoint=True)
            if out.stop:
                break
        if hasattr(it, "close"):
            it.close()  # type: ignore[attr-defined]
        if out.stop is None and len(reader) == 0:
            t0 = time.perf_counter()
            out.last_val = validate(run, state, rep)              # collective: val metrics
            out.excluded += window.exclude(time.perf_counter() - t0)
            state.epoch += 1
    return out


def flag_carrier(optimizers: list[Any], size: int) -> Any:
    """The optimizer whose gradient buckets can carry the preemption flag (several ranks
    and flat buckets, hpcdp.runtime.grad_buckets), else None."""
    if size == 1:
        return None
    return next((opt for opt in optimizers if hasattr(opt, "carry_max")), None)


def agree_stop(preempt: Any, hooks: Hooks, step: int, carrier: Any = None) -> str | None:
    """Collective on the preemption schedule: why every rank stops after `step`, if it does.

    The flag travels with the next step's gradients where they go in flat buckets
    (`carrier`), else in an all-reduce of its own. One rank agrees with itself: the
    same lagged schedule, without either."""
    if dist.size() == 1:
        def start_max(v: int) -> Any:
            return lambda: v
    elif carrier is not None:
        start_max = carrier.carry_max
    else:
        def start_max(v: int) -> Any:
            return dist.start_allreduce_max_int(v, "hpcdp.runtime.preempt")
    if preempt is not None and preempt.agreed_lagged(step, start_max):
        return "preempted"
    return hooks.stop_reason(step)


def resume_window(sums: MetricSums, saved: dict[str, Any] | None) -> None:
    """The training-metric sums a checkpoint cut short, so the first report after a resume
    covers the steps the uninterrupted run's does (the same outcome on every rank)."""
    if saved is None:
        return
    try:
        sums.load_state_dict(saved)
    except (KeyError, ValueError) as e:
        log.warning(f"training metrics start afresh after the resume: {e}")


def save(ckpts: CheckpointManager, run: setup.Run, state: TrainState, rep: Reporter,
         sums: MetricSums) -> None:
    path, note = ckpts.save(of_run(run), state, sums.state_dict())
    if note:
        log.warning(note)
    rep.info(f"checkpoint written: {path}")
    rep.checkpointed(state.step)


def metrics_text(values: dict[str, Any], names: list[str]) -> str:
    return " ".join(f"{n} {values[n]:.4f}" for n in names if n in values)


def report_window(run: setup.Run, rep: Reporter, window: StepTimes, sums: MetricSums,
                  state: TrainState, lr: float) -> None:
    """Collective: the task's metrics over ranks, then rank 0 logs and records."""
    values = sums.reduce("train")
    values.pop("samples", None)
    values.update(run.task.derive(values))
    times = window.summary()
    times["samples_per_s"] *= run.size  # every rank processes the same number of samples
    rates = run.task.rates(run.cfg, run.model, times["samples_per_s"], run.size,
                           run.device)
    mine = [times["busy_ms"], *window.phase_seconds()]  # for stragglers and `hpcdp report`
    rows = dist.gather_rows(mine, "hpcdp.busy") if run.size > 1 else [mine]  # collective
    spread = rank_spread([row[0] for row in rows]) if run.size > 1 else {}
    sent = traffic.window(run)  # bytes handed to the gradient all-reduces (PowerSGD)
    record = {"epoch": state.epoch, **values, "lr": lr, **times, **rates, **spread, **sent,
              **rank_fields([row[1:] for row in rows])}
    rep.record("train", state.step, record)
    rep.info(f"step {state.step}/{run.total_steps} epoch {state.epoch} "
             f"{metrics_text(values, list(values))} lr {lr:.4g} | "
             f"{times['samples_per_s']:.0f} samples/s{rates_text(rates)}, step "
             f"{times['step_ms']:.1f} ms (data {times['data_ms']:.1f}, compute "
             f"{times['compute_ms']:.1f}, comm {times['comm_ms']:.1f}){spread_text(spread)}"
             f"{traffic.text(sent)}")


def rates_text(rates: dict[str, float]) -> str:
    """A task's throughput figures for a log line: ', 52000 tokens/s, MFU 31.2%'."""
    parts = [f"{rates['tokens_per_s']:.0f} tokens/s" if k == "tokens_per_s" else
             f"MFU {100 * rates['mfu']:.1f}%" if k == "mfu" else f"{k} {v:.4g}"
             for k, v in rates.items()]
    return "".join(f", {p}" for p in parts)


def validate(run: setup.Run, state: TrainState, rep: Reporter) -> dict[str, Any]:
    """Collective: every validation sample scored once; rank 0 records and logs."""
    values = evaluate(run)
    rep.record("val", state.step, {"epoch": state.epoch, **values})
    names = [m.name for m in run.task.metrics] + list(run.task.derive(values))
    rep.info(f"epoch {state.epoch} done at step {state.step}: val "
             f"{metrics_text(values, names)} ({values['samples']} samples)")
    return values


def report_stop(run: setup.Run, ckpts: CheckpointManager, state: TrainState, reason: str,
                rep: Reporter) -> int:
    """Collective: preempted or stopped, the checkpoint is written; requeue the Slurm job.

    Rank 0 decides (hpcdp.runtime.preempt.after_stop) and every rank returns its exit status:
    0 only when training can go on (requeued, or nothing to requeue outside Slurm).
    """
    p = run.cfg.preempt
    note, code = after_stop(reason, run.root, p.requeue, p.max_requeues, os.environ,
                            lambda v: dist.broadcast_object(v, "hpcdp.stop"))
    rep.info(f"{reason} at step {state.step}: checkpoint written to "
             f"{ckpts.path(state.step)}{note}")
    rep.ended(None, reason)
    return code


def earlier_throughput(path: Any, summary: dict[str, Any], keys: list[str]) -> float:
    """Copy `keys` from the summary.json at `path` into `summary` where it has them (a run
    that trained nothing in this process has no throughput of its own); returns
    samples/s as it then stands."""
    try:
        earlier = json.loads(path.read_text())
    except (OSError, ValueError):
        earlier = {}
    summary.update({k: earlier[k] for k in keys if isinstance(earlier.get(k), (int, float))})
    return float(summary["samples_per_s"])


def summarize(run: setup.Run, ckpts: CheckpointManager, state: TrainState, out: Outcome,
              resumed_from: str | None, rep: Reporter) -> None:
    """Final validation if the loop did not end on one; rank 0 writes summary.json."""
    cfg = run.cfg
    if not out.last_val:  # e.g. max_steps ended mid-epoch, or a finished run resumed
        out.last_val = validate(run, state, rep)                  # collective: val metrics
    seconds = time.perf_counter() - out.started - out.excluded
    throughput = dist.allreduce_sum([out.samples / max(seconds, 1e-9)],
                                    "hpcdp.throughput")[0]       # collective: throughput
    final = ckpts.path(state.step)
    val = {f"val_{k}": v for k, v in out.last_val.items()}
    rates = run.task.rates(cfg, run.model, throughput, run.size, run.device)
    summary = {
        **val, "samples_per_s": throughput, **rates, "steps": state.step, "epochs": state.epoch,
        "world_size": run.size, "task": cfg.task.name, "model": cfg.model.name,
        "global_batch": run.global_batch, "lr_scaling": cfg.optim.lr_scaling,
        "peak_lr": run.schedule.peak_lr, "samples_seen": state.samples_seen,
        "gradients": setup.gradient_layout(run),  # for `hpcdp plan` (hpcdp.plan.measure)
        "gradient_traffic": traffic.per_step(run),  # bytes per step handed to the all-reduces
        "run_dir": str(cfg.run_dir), "checkpoint": str(final) if final.exists() else None,
        "metrics": str(rep.jsonl_path), "tensorboard": str(rep.tb_dir),
        "resumed_from": resumed_from, "data_paths_read": run.data_paths_read,
    }
    if run.root:
        path = cfg.run_dir / "summary.json"
        if out.samples == 0:  # a finished run resumed: keep the throughput it was trained at
            throughput = earlier_throughput(path, summary, ["samples_per_s", *rates])
        path.write_text(json.dumps(summary, indent=2) + "\n")
    rep.ended(summary)
    names = [m.name for m in run.task.metrics] + list(run.task.derive(out.last_val))
    rep.info(f"done: val {metrics_text(out.last_val, names)}, "
             f"{throughput:.0f} samples/s{rates_text(rates)} on {run.size} rank(s), "
             f"{state.step} steps; outputs in {cfg.run_dir}")
