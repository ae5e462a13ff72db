"""The session: what a script with its own training loop calls, on every rank alike.

Each call that has a collective says so; every rank must make the same calls in
the same order, as with any Horovod program. The parts are the trainer's own
(hpcdp.train.startup, setup, checkpoints, hooks, loop.agree_stop and
hpcdp.runtime.preempt): the session only strings them together for a loop it
does not own.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import torch

from hpcdp import config as cfgmod
from hpcdp import tasks
from hpcdp.cluster import sweep
from hpcdp.config import Config, ConfigError
from hpcdp.data.read.protocol import TrainingReader
from hpcdp.data.staging import collective as staging
from hpcdp.runtime import dist, faults, watchdog
from hpcdp.runtime.preempt import Preemption, after_stop
from hpcdp.train import checkpoint_format as ckformat
from hpcdp.train import setup, startup
from hpcdp.train.checkpoints import CheckpointManager, Parts, TrainState
from hpcdp.train.hooks import Hooks
from hpcdp.train.loop import agree_stop
from hpcdp.train.reporting import Reporter, setup_logging
from hpcdp.train.tracking.hub import Trackers

log = logging.getLogger("hpcdp.train")

#: What a session's checkpoints record as their task: the trainer refuses them, and a
#: session refuses the trainer's.
TASK = "session"


def configure(argv: Sequence[str] | None = None) -> Config:
    """hpcdp's config from `[--config FILE] section.key=value ...` (default: sys.argv[1:])
    as `hpcdp train` reads it, with an array task's own set (HPCDP_SWEEP) last; HPCDP_FAULT
    checked. On a bad one every rank prints the error and exits 2, before Horovod."""
    p = argparse.ArgumentParser(description="A training script built on hpcdp.session: "
                                "its arguments are hpcdp's config (docs/config.md).")
    p.add_argument("--config", "-c", help="TOML config file")
    p.add_argument("overrides", nargs="*", metavar="section.key=value")
    args = p.parse_args(sys.argv[1:] if argv is None else list(argv))
    try:
        overrides = [*args.overrides, *sweep.task_overrides(os.environ)]
        cfg = cfgmod.build(args.config, overrides, tasks.defaults)
        faults.armed()
        if cfg.run.tracker_model:
            raise ConfigError("run.tracker_model: a session's network is the script's own, "
                              "which hpcdp export cannot rebuild; log it from the script")
    except (ConfigError, faults.FaultError) as e:
        print(f"hpcdp session: error: {e}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    return cfg


def start(argv: Sequence[str] | None = None) -> Session:
    """Collective: Horovod with hpcdp's runtime settings, this rank's device, the stall
    watchdog and the preemption handlers, the data staged when data.stage_dir says so.

    `argv` (default: sys.argv[1:]) is `[--config FILE]` and the keys of hpcdp's config
    (run.dir, run.seed, data.path, data.global_batch_size, checkpoint.*, preempt.*,
    horovod.*, ...), as for `hpcdp train`.
    """
    cfg = configure(argv)
    preempt = startup.begin(cfg)
    sys.excepthook = _abort_on_uncaught
    device, error = startup.place(cfg)                  # collective: hpcdp.runtime.placement
    read_cfg = staging.stage(cfg, error is not None)     # collective: hpcdp.stage.*
    batch = 0
    try:
        batch = setup.per_rank_batch(cfg, dist.size())
    except ConfigError as e:
        error = error or str(e)
    dist.agree(error, "setup")                           # collective: hpcdp.agree.setup
    if dist.rank() == 0:  # rank 0 writes the run folder: its log and the config
        cfg.run_dir.mkdir(parents=True, exist_ok=True)
        setup_logging(cfg.run_dir, True)
        (cfg.run_dir / "config.toml").write_text(cfgmod.dumps(cfg))
    return Session(read_cfg, device, batch, preempt)


def _abort_on_uncaught(kind: type[BaseException], error: BaseException,
                       trace: TracebackType | None) -> None:
    """One rank's uncaught error ends the job (the others would wait in a collective);
    an error every rank agreed on ends each rank with exit 2, as the trainer's does."""
    if isinstance(error, dist.AgreedError):
        print(f"hpcdp session: error: {error}", file=sys.stderr, flush=True)
        watchdog.stop()
        dist.shutdown_and_exit(2)
    text = "".join(traceback.format_exception(kind, error, trace))
    sys.stderr.write(f"[hpcdp rank {dist.rank()}] fatal error, aborting the job:\n{text}")
    dist.abort_job(1)


def _mark_step(opt: Any) -> None:
    """The wrapper's step() waits for the gradients' all-reduce: marked as a collective
    entered, as the trainer's step marks it, so that the watchdog tells a rank held there
    from one that never reached it (the same wrapping as torch's LR schedulers do)."""
    step = opt.step

    def marked(*args: Any, **kwargs: Any) -> Any:
        watchdog.enter_collective("allreduce gradients")
        return step(*args, **kwargs)

    opt.step = marked


class Session:
    """One rank's run of a script's own loop: readers, optimizers, resume, step boundaries."""

    def __init__(self, cfg: Config, device: torch.device, batch: int,
                 preempt: Preemption | None) -> None:
        self.cfg = cfg
        self.device = device
        self.rank, self.size = dist.rank(), dist.size()
        self.batch = batch  # per rank: data.global_batch_size over the ranks, or data.batch_size
        self.state = TrainState()
        self.resumed_from: str | None = None
        self._preempt = preempt
        self._hooks = Hooks(cfg, self.rank, cfg.run_dir)  # run.stop_at_step, HPCDP_FAULT
        self._ckpts = CheckpointManager(cfg, self.rank == 0)
        self._parts: Parts | None = None
        self._saved = -1  # the step of the last checkpoint written
        self._reporter: Reporter | None = None  # from the first log() on
        self._resumed_step: int | None = None  # the step of the checkpoint resumed

    @property
    def root(self) -> bool:
        return self.rank == 0

    @property
    def global_batch(self) -> int:
        """Samples per optimizer step over all ranks (what a resume must keep)."""
        return self.batch * self.size * self.cfg.horovod.backward_passes_per_step

    # -- set-up -------------------------------------------------------------------------

    def reader(self, names: Sequence[str] = ("x", "y"), file: str | None = None) -> TrainingReader:
        """Collective (the ranks agree it opened): this rank's shuffled, equal batches of
        the datasets `names` of `file` (default data.train_file) under data.path.

        The global order depends on run.seed, the epoch and the global batch, never on
        the number of ranks; its state resumes mid-epoch on any world size.
        """
        path = Path(self.cfg.data.path) / (file or self.cfg.data.train_file)
        reader, error = None, None
        try:
            setup.checked_layout(path, list(names), min_samples=self.global_batch)
            # The script's own loop reads each micro-batch it accumulates: `batch` rows.
            reader = setup.training_reader(self.cfg, path, list(names), self.batch,
                                           self.rank, self.size, self.device, accumulation=1)
            setup.keep_open(reader)
        except Exception as e:  # noqa: BLE001 - reported on every rank alike
            error = str(e) if isinstance(e, ValueError) else f"{type(e).__name__}: {e}"
        dist.agree(error, "reader")                          # collective: hpcdp.agree.reader
        assert reader is not None
        return reader

    def optimizer(self, base: torch.optim.Optimizer, model: torch.nn.Module) -> Any:
        """`base` wrapped to average gradients over ranks as the trainer's are (flat
        buckets or Horovod's DistributedOptimizer, [horovod] settings); use only the
        wrapper from here on. No collective."""
        wrapped = setup.distributed(self.cfg, base, model, self.device, self.size)
        if wrapped is not base:
            _mark_step(wrapped)
        return wrapped

    def resume(self, model: torch.nn.Module, optimizers: Sequence[Any], reader: TrainingReader,
               extra: dict[str, Any] | None = None) -> TrainState:
        """Collective: the newest checkpoint in checkpoint.dir loaded on every rank (model,
        optimizers, reader position, RNG, and `extra` updated in place), then rank 0's
        parameters and optimizer state broadcast. Returns where to continue (a fresh
        TrainState when there is nothing to resume).

        `extra` is the script's own state: tensors, numbers, strings, lists, tuples and
        dicts, rank 0's saved; anything else is refused when a checkpoint is written.
        """
        name = f"{type(model).__module__}.{type(model).__qualname__}"
        self._parts = Parts(model, list(optimizers), reader, self.rank, self.size,
                            self.global_batch, TASK, name,
                            extra=extra if extra is not None else {}, seed=self.cfg.run.seed)
        self.state, self.resumed_from = self._ckpts.resume(self._parts)  # collective
        dist.broadcast_start(model, self._parts.optimizers)  # collective: parameters
        self._saved = self.state.step if self.resumed_from else -1
        self._resumed_step = self.state.step if self.resumed_from else None
        log.info(f"{'resumed from ' + self.resumed_from if self.resumed_from else 'fresh start'}: "
                 f"step {self.state.step}, epoch {self.state.epoch}, {self.size} rank(s), "
                 f"batch {self.batch}/rank, {self.global_batch} global, device {self.device}")
        self._hooks.before_step(self.state.step)  # the watchdog's beat, armed faults
        return self.state

    # -- the loop -----------------------------------------------------------------------

    def epochs(self, count: int) -> Iterator[int]:
        """The epochs from the resumed one up to `count`, the reader set to each: a resumed
        epoch goes on where the checkpoint left it."""
        parts = self._started()
        while self.state.epoch < count:
            parts.reader.set_epoch(self.state.epoch)
            self._hooks.epoch = self.state.epoch
            yield self.state.epoch
            self.state.epoch += 1

    def step_done(self) -> None:
        """Collective, once after each optimizer step: the watchdog's beat, the lagged
        preemption vote, a checkpoint when due (checkpoint.every_steps).

        On an agreed stop (a preemption signal on any rank, or run.stop_at_step) it writes
        a checkpoint and ends the process on every rank: the Slurm job requeued, with
        the exit statuses of docs/checkpoints.md. It returns otherwise.
        """
        self._started()
        self.state.advance(self.global_batch)
        # The next step's beat first, and the faults armed for it: a rank held here has
        # then entered one collective fewer than the others, and the watchdog names it.
        self._hooks.before_step(self.state.step)
        reason = agree_stop(self._preempt, self._hooks, self.state.step)  # collective: preempt
        every = self.cfg.checkpoint.every_steps
        if reason or (every and self.state.step % every == 0):
            self.save()                                  # collective: hpcdp.rng, hpcdp.agree.save
        if reason:
            self._stop(reason)

    def save(self) -> Path:
        """Collective: a checkpoint of this step, written by rank 0 (atomic, keep-k).

        The script's extra state is checked first on every rank: a value a weights-only
        load could not read back is refused, naming its key, before anything is written.
        """
        parts = self._started()
        error = None
        try:
            ckformat.to_safe(parts.extra, "the session's extra state")
        except ckformat.CheckpointError as e:
            error = str(e)
        dist.agree(error, "extra")                           # collective: hpcdp.agree.extra
        path, note = self._ckpts.save(parts, self.state)
        if note:
            log.warning(note)
        log.info(f"checkpoint written: {path}")  # rank 0's log only (setup_logging)
        self._saved = self.state.step
        if self._reporter is not None:
            self._reporter.checkpointed(self.state.step)
        return path

    def finish(self) -> None:
        """Collective, after the loop: the last checkpoint (unless this step has one), then
        every rank exits 0. Does not return."""
        if self._saved != self.state.step:
            self.save()
        if self._preempt is not None:
            self._preempt.drain()  # the last vote's all-reduce, so no collective is left open
        log.info(f"done: {self.state.step} steps, {self.state.epoch} epochs")
        self._close_reporter({"steps": self.state.step, "epochs": self.state.epoch}, None)
        self._exit(0)

    def log(self, values: Mapping[str, float], kind: str = "train") -> None:
        """Rank 0: a record of `values` at this step, in run.dir/metrics.jsonl, TensorBoard
        and the trackers of run.trackers, which get it once a checkpoint covers its step,
        so a resumed run logs no step twice. Not a collective, and a no-op on the other
        ranks: average what differs by rank first (`average`)."""
        self._started()
        if self._reporter is None:  # a script that never logs pays for no writer
            self._reporter = self._open_reporter()
        self._reporter.record(kind, self.state.step, dict(values))

    def average(self, values: Sequence[float], name: str = "hpcdp.session.average") -> list[float]:
        """Collective: the mean over ranks of a few numbers (a loss to log, say)."""
        return [v / self.size for v in dist.allreduce_sum(values, name)]

    # -- the end ------------------------------------------------------------------------

    def _started(self) -> Parts:
        if self._parts is None:
            raise RuntimeError("call session.resume(model, optimizers, reader) before the loop")
        return self._parts

    def _stop(self, reason: str) -> None:
        """Collective: rank 0 requeues the Slurm job (when it should); every rank exits with
        its status (hpcdp.runtime.preempt.after_stop)."""
        if self._preempt is not None:
            self._preempt.drain()
        p = self.cfg.preempt
        note, code = after_stop(reason, self.root, p.requeue, p.max_requeues, os.environ,
                                lambda v: dist.broadcast_object(v, "hpcdp.stop"))
        log.info(f"{reason} at step {self.state.step}: checkpoint written to "
                 f"{self._ckpts.path(self.state.step)}{note}")
        self._close_reporter(None, reason)
        self._exit(code)

    def _open_reporter(self) -> Reporter:
        """Rank 0's metrics file and trackers, continued on a resume (records after the
        checkpoint resumed are dropped: the script logs those steps again)."""
        cfg, resumed = self.cfg, self._resumed_step
        trackers = Trackers.start(cfg, resumed, os.environ) if self.rank == 0 else None
        return Reporter(cfg.run_dir, self.rank == 0, cfg.log.jsonl, cfg.log.tensorboard,
                        False, 0, resumed or 0, drop_after=resumed, trackers=trackers)

    def _close_reporter(self, summary: dict[str, Any] | None, stopped: str | None) -> None:
        """The trackers finished with `summary`, or stopped for a requeue; bounded by
        run.tracker_close_timeout_s."""
        if self._reporter is not None:
            self._reporter.ended(summary, stopped)
            self._reporter.close()

    def _exit(self, code: int) -> None:
        # The signal handlers stay: a TERM that follows (Slurm ends a requeued job that
        # way) must not kill a rank that is finishing cleanly.
        self._hooks.close()
        watchdog.stop()
        dist.shutdown_and_exit(code)
        raise SystemExit(code)  # not reached when Horovod ran
