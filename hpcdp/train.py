"""`hpcdp train` / `python -m hpcdp.train`: data-parallel training with Horovod.

The same command runs alone, under mpirun, horovodrun (MPI or Gloo) or
`srun --mpi=pmix`. The order of a run, which every rank follows:

1. parse and check the config (no collective yet: every rank fails alike);
2. hvd.init, pin a device, print the identity line;
3. set up data, model and optimizer; all ranks agree that it worked;
4. rank 0 picks the checkpoint to resume from and broadcasts its bytes;
5. broadcast parameters (and optimizer state) from rank 0;
6. train: at each step boundary the same collectives on every rank
   (metrics every `log.every_steps`, checkpoint RNG gathering, preemption
   agreement), validate at epoch ends, checkpoint, summarize.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import logging
import os
import random
import sys
import time
import warnings
from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from hpcdp import checkpoint as ckpt
from hpcdp import config as cfgmod
from hpcdp import faults, watchdog
from hpcdp import schedule as sched
from hpcdp.cli import report_crashes
from hpcdp.config import Config, ConfigError
from hpcdp.grad_buckets import bucketed
from hpcdp.hvd_settings import CPU_BUCKET_BYTES
from hpcdp.models import ModelError, check_name

log = logging.getLogger("hpcdp.train")


def parse_args(argv: list[str] | None) -> tuple[Config, bool]:
    """--config FILE, --print-config, then `section.key=value` overrides."""
    p = argparse.ArgumentParser(
        prog="hpcdp train",
        description="Train a model data-parallel with Horovod. Overrides like optim.lr=0.05 "
        "take precedence over the config file, which takes precedence over the defaults.",
    )
    p.add_argument("--config", "-c", help="TOML config file (e.g. hpcdp/configs/digits.toml)")
    p.add_argument("--print-config", action="store_true", help="print the effective config, exit")
    p.add_argument("overrides", nargs="*", metavar="section.key=value")
    args = p.parse_args(argv)
    return cfgmod.build(args.config, args.overrides), args.print_config


def main(argv: list[str] | None = None) -> int:
    report_crashes()  # also under `python -m hpcdp.train`, which bypasses the `hpcdp` command
    try:
        cfg, print_only = parse_args(argv)
        check_name(cfg.model.name)
        faults.armed()  # a malformed HPCDP_FAULT fails here, on every rank alike
    except (ConfigError, ModelError, faults.FaultError) as e:
        print(f"hpcdp train: error: {e}", file=sys.stderr, flush=True)
        return 2
    if print_only:
        print(cfgmod.dumps(cfg))
        return 0
    from hpcdp.dist import AgreedError

    try:
        code = train(cfg)
    except AgreedError as e:
        print(f"hpcdp train: error: {e}", file=sys.stderr, flush=True)
        code = 2
    watchdog.stop()
    exit_after_horovod(code)
    return code  # not reached when Horovod ran


def exit_after_horovod(code: int) -> None:
    """Shut Horovod (and MPI) down, then leave without the interpreter's teardown.

    With parallel HDF5, MPI_Finalize also terminates the HDF5 library; h5py's
    module teardown afterwards calls into it and crashes the process at exit
    (seen as a segfault in H5Tunregister after a successful run). Closing the
    readers' files (explicitly or from a reader's __del__) crashed too, now and
    then, inside h5py's File.close (H5F__close_cb; about 1 run in 16 under load,
    never in a single process), so the read-only input files stay open until
    HDF5's own termination. Our outputs are closed and
    flushed by now, so skipping the teardown loses nothing.
    """
    import horovod.torch as hvd

    if not hvd.is_initialized():
        return
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    hvd.shutdown()
    os._exit(code)


# --------------------------------------------------------------------------- helpers


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_state() -> dict[str, Any]:
    """This rank's random generators, in a form any process can restore."""
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def fingerprints(x: torch.Tensor) -> list[str]:
    """A short hash of each sample's bytes: lets tests check which samples a rank saw."""
    arr = x.numpy()
    return [hashlib.blake2b(arr[i].tobytes(), digest_size=8).hexdigest() for i in range(len(arr))]


def per_rank_batch(cfg: Config, size: int) -> int:
    """data.global_batch_size split over the ranks (must divide), else data.batch_size."""
    g = cfg.data.global_batch_size
    if not g:
        return cfg.data.batch_size
    if g % size:
        raise ConfigError(
            f"data.global_batch_size={g} does not divide over {size} ranks "
            f"(choose a multiple of {size}, or set data.batch_size per rank)"
        )
    return g // size


def uneven_steps_error(steps_per_rank: list[int]) -> str | None:
    """Why the ranks must not start when they would take different numbers of steps.

    Every step ends in collectives; a rank that runs out of data first would leave
    the others waiting forever. The sharded reader gives equal steps by construction;
    this guards any other data source (pure, on what every rank gathered).
    """
    if len(set(steps_per_rank)) <= 1:
        return None
    listed = ", ".join(f"rank {r}: {n}" for r, n in enumerate(steps_per_rank))
    return (f"the ranks would take different numbers of training steps per epoch ({listed}); "
            "uneven data would hang the job at the first step one rank does not reach")


# Readers live until the process ends (see exit_after_horovod): h5py's File.close
# on them crashed intermittently at the end of multi-rank runs.
_KEEP_OPEN: list[Any] = []


@dataclass
class Setup:
    """What every rank built in step 3, before any collective that depends on it."""

    device: torch.device
    batch: int
    train_reader: Any
    val_reader: Any
    model: torch.nn.Module


def local_setup(cfg: Config, rank: int, size: int, device: torch.device) -> Setup:
    """Readers and model for this rank; raises on bad data or a model that cannot fit it."""
    from hpcdp.data.reader import ShardedReader, validate_dataset
    from hpcdp.models import build_model

    batch = per_rank_batch(cfg, size)
    accum = cfg.horovod.backward_passes_per_step
    root = Path(cfg.data.path)
    train_path, val_path = root / cfg.data.train_file, root / cfg.data.val_file
    vbatch = cfg.data.val_batch_size or batch
    info = validate_dataset(train_path, cfg.data.x_name, cfg.data.y_name,
                            min_samples=batch * size * accum)
    validate_dataset(val_path, cfg.data.x_name, cfg.data.y_name, min_samples=vbatch * size)
    common = dict(rank=rank, world_size=size, seed=cfg.run.seed, x_name=cfg.data.x_name,
                  y_name=cfg.data.y_name, prefetch=cfg.data.prefetch,
                  pin_memory=device.type == "cuda")
    train_reader = ShardedReader(train_path, batch_size=batch,
                                 window_samples=cfg.data.window_samples or None,
                                 virtual_shards=cfg.data.virtual_shards or None, **common)
    val_reader = ShardedReader(val_path, batch_size=vbatch, **common)
    _KEEP_OPEN.extend((train_reader, val_reader))  # closed by process exit, not by h5py
    if train_reader.steps_per_epoch < accum:
        raise ConfigError(
            f"{train_path}: {train_reader.steps_per_epoch} batches per epoch, fewer than "
            f"horovod.backward_passes_per_step={accum}"
        )
    if tuple(val_reader.sample_shape) != tuple(info.sample_shape):
        raise ConfigError(f"{val_path}: samples shaped {val_reader.sample_shape}, but "
                          f"{train_path} has {info.sample_shape}")
    torch.manual_seed(cfg.run.seed)  # the same initial weights everywhere (then broadcast anyway)
    model = build_model(cfg.model.name, info.sample_shape, cfg.model.num_classes,
                        cfg.model.width, cfg.model.cifar_stem)
    return Setup(device, batch, train_reader, val_reader, model)


def to_input(x: torch.Tensor, cfg: Config, device: torch.device) -> torch.Tensor:
    """Stored dtype -> float on the device; integer inputs are scaled to [0, 1] first."""
    integer = not torch.is_floating_point(x)
    x = x.to(device, non_blocking=True).float()
    if integer:
        x = x / cfg.data.scale
    if cfg.data.mean != 0.0 or cfg.data.std != 1.0:
        x = (x - cfg.data.mean) / cfg.data.std
    return x


def autocast(cfg: Config, device: torch.device) -> Any:
    if cfg.run.precision == "fp32":
        return nullcontext()
    dtype = torch.bfloat16 if cfg.run.precision == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


def decide_resume(cfg: Config, model: torch.nn.Module) -> dict[str, Any]:
    """Rank 0 only: what to resume from, as a message every rank can act on."""
    mode = cfg.checkpoint.resume
    try:
        if mode == "none":
            return {"kind": "fresh"}
        if mode == "auto":
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                found = ckpt.find_latest(cfg.checkpoint_dir)
            notes = [str(w.message) for w in caught]
            if found is None:
                return {"kind": "fresh", "notes": notes}
            path, data = found.path, found.data
        else:
            path, notes = Path(mode), []
            data = ckpt.read_verified(path)
        state = ckpt.decode(data, str(path))
        ckpt.check_compatible(state, model, cfg.model.name, f"checkpoint {str(path)!r}")
        return {"kind": "resume", "path": str(path), "data": data, "notes": notes}
    except ckpt.CheckpointError as e:
        return {"kind": "error", "message": str(e)}


def evaluate(model: torch.nn.Module, reader: Any, cfg: Config, device: torch.device,
             hvd: Any) -> dict[str, float]:
    """Loss and accuracy over every rank's validation partition (collective)."""
    watchdog.section("validation")
    model.eval()
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    correct = torch.zeros((), dtype=torch.float64, device=device)
    count = 0
    reader.set_epoch(0)
    with torch.no_grad(), autocast(cfg, device):
        for x, y in reader:
            x, y = to_input(x, cfg, device), y.to(device, non_blocking=True)
            out = model(x)
            loss_sum += F.cross_entropy(out.float(), y, reduction="sum").double()
            correct += (out.argmax(1) == y).sum().double()
            count += len(y)
    from hpcdp import dist

    total_loss, total_correct, total = dist.allreduce_sum(
        [loss_sum.item(), correct.item(), float(count)], name="hpcdp.val")
    model.train()
    return {"loss": total_loss / max(total, 1.0), "acc": total_correct / max(total, 1.0),
            "samples": int(total)}


# --------------------------------------------------------------------------- the run


def train(cfg: Config) -> int:
    """One run, from init to summary; returns the process exit code."""
    import horovod.torch as hvd

    from hpcdp import dist
    from hpcdp.metrics import Reporter, StepTimes, setup_logging
    from hpcdp.preempt import Preemption, requeue_job

    run_dir = cfg.run_dir
    # Handlers first: a signal that arrives during start-up must not kill the rank.
    preempt = None
    if cfg.preempt.enabled and cfg.preempt.signals:
        preempt = Preemption(cfg.preempt.signals, cfg.preempt.check_every).install()
    dist.init(cfg.horovod, run_dir,
              on_gpu=dist.wants_gpu(cfg.run.device, torch.cuda.is_available()))
    rank, size = hvd.rank(), hvd.size()
    root = rank == 0
    setup_logging(None, root)
    watchdog.start(cfg.run, rank, size, run_dir, lambda: dist.abort_job(1))

    with dist.abort_on_error():
        # --- 2/3: device, data, model; agree before anything depends on them.
        error: str | None = None
        setup: Setup | None = None
        try:
            device = dist.pin_device(cfg.run.device)
        except dist.AgreedError as e:
            device, error = torch.device("cpu"), str(e)
        dist.print_identity(device)
        misplaced = dist.placement_error(device)  # collective: every rank reaches it
        if error is None:
            error = misplaced
        if error is None:
            try:
                if cfg.run.precision == "fp16" and device.type != "cuda":
                    raise ConfigError("run.precision='fp16' needs a GPU (use bf16 or fp32 here)")
                if cfg.model.sync_bn and size > 1 and device.type != "cuda":
                    raise ConfigError("model.sync_bn=true needs GPUs: Horovod's SyncBatchNorm "
                                      "takes CUDA tensors only")
                setup = local_setup(cfg, rank, size, device)
            except Exception as e:  # noqa: BLE001 - any setup failure is reported on all ranks
                error = str(e) if isinstance(e, ValueError) else f"{type(e).__name__}: {e}"
        dist.agree(error, "setup")
        assert setup is not None
        reader, val_reader = setup.train_reader, setup.val_reader
        uneven = uneven_steps_error(hvd.allgather_object(reader.steps_per_epoch,
                                                         name="hpcdp.steps"))
        if uneven:
            raise dist.AgreedError(uneven)
        model = setup.model
        if cfg.model.sync_bn and size > 1:
            from hpcdp.models import convert_sync_batchnorm

            model = convert_sync_batchnorm(model, hvd.SyncBatchNorm)
        model.to(device)
        seed_everything(cfg.run.seed + rank)  # per-rank streams for anything random later

        accum = cfg.horovod.backward_passes_per_step
        adasum = cfg.horovod.op == "adasum"
        update_batch = sched.update_batch(setup.batch, size, accum, adasum)
        lr_scale = sched.lr_scale(cfg.optim.lr_scaling, update_batch, cfg.optim.ref_batch)
        # Both wrappers build a new optimizer over the same parameter groups: use only
        # `optimizer` from here on.
        optimizer = _distributed_optimizer(cfg, model, device, hvd)
        scaler = torch.amp.GradScaler("cuda") if cfg.run.precision == "fp16" else None
        steps_per_epoch = reader.steps_per_epoch // accum
        schedule = sched.from_epochs(
            cfg.optim.lr, lr_scale, cfg.schedule.kind, steps_per_epoch, cfg.run.epochs,
            cfg.schedule.warmup_epochs, cfg.schedule.warmup_start_factor,
            cfg.schedule.min_factor, cfg.schedule.milestones, cfg.schedule.gamma,
            rule=cfg.optim.lr_scaling, batch=update_batch, ref_batch=cfg.optim.ref_batch)

        # --- 4: rank 0 decides what to resume from; every rank loads the same bytes.
        decision = decide_resume(cfg, model) if root else None
        decision = hvd.broadcast_object(decision, root_rank=0, name="hpcdp.resume")
        if decision["kind"] == "error":
            raise dist.AgreedError(decision["message"])
        for note in decision.get("notes", []):
            log.warning(note)
        step, epoch = 0, 0
        resumed_from = None
        if decision["kind"] == "resume":
            state = ckpt.decode(decision["data"], decision["path"])
            error = None if cfg.optim.allow_lr_change else sched.lr_change_on_resume(
                state.get("schedule") or {}, schedule)
            if error is not None:
                raise dist.AgreedError(f"checkpoint {decision['path']!r}: {error}")
            try:
                step, epoch = _load_state(state, model, optimizer, scaler, reader, rank, size,
                                          cfg)
            except Exception as e:  # noqa: BLE001 - e.g. a reader state this world cannot use
                error = f"checkpoint {decision['path']!r} cannot be resumed here: {e}"
            dist.agree(error, "resume")
            resumed_from = decision["path"]
        del decision
        # --- 5: the same starting point everywhere.
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        # A fresh optimizer has no state to send (Horovod would fill it with a dummy
        # step first); a resumed one has it on every rank.
        if optimizer.state:
            hvd.broadcast_optimizer_state(optimizer, root_rank=0)

        # --- from here on, rank 0 writes the run dir.
        if root:
            run_dir.mkdir(parents=True, exist_ok=True)
            setup_logging(run_dir, True)
            (run_dir / "config.toml").write_text(cfgmod.dumps(cfg))
        total_steps = cfg.run.epochs * steps_per_epoch
        if cfg.run.max_steps:
            total_steps = min(total_steps, cfg.run.max_steps)
        rep = Reporter(run_dir, root, cfg.log.jsonl, cfg.log.tensorboard, cfg.log.progress,
                       total_steps, step, drop_after=step if resumed_from else None)
        from hpcdp.models import count_parameters

        rep.info(
            f"{'resumed from ' + resumed_from if resumed_from else 'fresh start'}: "
            f"model {cfg.model.name} ({count_parameters(model):,} parameters) on {size} rank(s), "
            f"batch {setup.batch}/rank x {accum} accumulation = {setup.batch * size * accum} "
            f"global, peak lr {schedule.peak_lr:g} ({lr_rule_text(cfg, update_batch)}), "
            f"{steps_per_epoch} steps/epoch, "
            f"{total_steps} steps, device {device}"
        )
        trace = None
        if cfg.log.trace_samples:
            (run_dir / "trace").mkdir(parents=True, exist_ok=True)
            trace = (run_dir / "trace" / f"rank-{rank}.jsonl").open("a")

        # --- 6: the loop.
        window = StepTimes()
        run_samples, loop_start, excluded = 0, time.perf_counter(), 0.0
        totals = torch.zeros(3, dtype=torch.float64, device=device)  # loss sum, correct, count
        last_val: dict[str, float] = {}
        stop_reason = None
        model.train()
        while step < total_steps and stop_reason is None:
            reader.set_epoch(epoch)  # keeps the position when a resumed state is for this epoch
            it: Iterator[Any] = iter(reader)
            for _ in range(min(len(reader) // accum, total_steps - step)):
                lr = schedule.lr(step)
                watchdog.beat(step)
                nan = faults.inject(step, rank)
                t_data, t_compute, t_comm = _train_step(
                    model, optimizer, scaler, it, lr, totals, cfg, device, adasum and size > 1,
                    None if trace is None else (trace, epoch, step), step=step, nan=nan)
                step += 1
                window.add(t_data, t_compute, t_comm, setup.batch * accum)
                run_samples += setup.batch * accum
                rep.advance(1)

                if step % cfg.log.every_steps == 0 or step == total_steps:
                    _report_window(rep, window, totals, step, total_steps, epoch, lr, size)
                    window = StepTimes()
                t0 = time.perf_counter()
                if preempt is not None and preempt.agreed_lagged(
                        step, lambda v: dist.start_allreduce_max_int(v, "hpcdp.preempt")):
                    stop_reason = "preempted"
                elif cfg.run.stop_at_step and step == cfg.run.stop_at_step:
                    stop_reason = "stopped"
                window.comm += time.perf_counter() - t0
                if stop_reason or step == total_steps or (
                        cfg.checkpoint.every_steps and step % cfg.checkpoint.every_steps == 0):
                    t0 = time.perf_counter()
                    path = _save(cfg, step, epoch, model, optimizer, scaler, reader, schedule,
                                 size, root, hvd)
                    rep.info(f"checkpoint written: {path}")
                    excluded += window.exclude(time.perf_counter() - t0)
                if stop_reason:
                    break
            if hasattr(it, "close"):
                it.close()  # type: ignore[attr-defined]
            if stop_reason is None and len(reader) // accum == 0:
                t0 = time.perf_counter()
                last_val = evaluate(model, val_reader, cfg, device, hvd)
                rep.record("val", step, {"epoch": epoch, **last_val})
                rep.info(f"epoch {epoch} done at step {step}: val loss {last_val['loss']:.4f} "
                         f"acc {last_val['acc']:.4f} ({last_val['samples']} samples)")
                excluded += window.exclude(time.perf_counter() - t0)
                epoch += 1
        train_seconds = time.perf_counter() - loop_start - excluded
        if preempt is not None:
            preempt.drain()  # the last check's all-reduce, so no collective is left open

        # The signal handlers stay until the process exits: a TERM that follows (Slurm
        # ends a requeued job that way) must not kill a rank that is finishing cleanly.
        if trace is not None:
            trace.close()
        final = ckpt.step_path(cfg.checkpoint_dir, step)
        if stop_reason:
            job = os.environ.get("SLURM_JOB_ID")
            requeued = ""
            if root and stop_reason == "preempted" and job and cfg.preempt.requeue:
                requeued = (f", requeued job {job}" if requeue_job(job)
                            else f", job {job} not requeued (see the warning above)")
            rep.info(f"{stop_reason} at step {step}: checkpoint written to {final}{requeued}")
            rep.close()
            return 0  # readers stay open: see exit_after_horovod
        if not last_val:  # e.g. max_steps ended mid-epoch, or a finished run resumed
            last_val = evaluate(model, val_reader, cfg, device, hvd)
            rep.record("val", step, {"epoch": epoch, **last_val})
        # Training wall time without validation and checkpoints, summed over the ranks.
        throughput = dist.allreduce_sum([run_samples / max(train_seconds, 1e-9)],
                                        "hpcdp.throughput")[0]
        summary = {
            "val_acc": last_val["acc"], "val_loss": last_val["loss"],
            "val_samples": last_val["samples"], "samples_per_s": throughput, "steps": step,
            "epochs": epoch, "world_size": size, "model": cfg.model.name,
            "global_batch": setup.batch * size * accum,
            "lr_scaling": cfg.optim.lr_scaling, "peak_lr": schedule.peak_lr,
            "run_dir": str(run_dir), "checkpoint": str(final) if final.exists() else None,
            "metrics": str(rep.jsonl_path), "tensorboard": str(rep.tb_dir),
            "resumed_from": resumed_from,
        }
        if root:
            (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        rep.info(f"done: val acc {summary['val_acc']:.4f}, {throughput:.0f} samples/s on "
                 f"{size} rank(s), {step} steps; outputs in {run_dir}")
        rep.close()
        return 0  # readers stay open: see exit_after_horovod


def lr_rule_text(cfg: Config, update_batch: int) -> str:
    """How the peak rate came about, for the start line: 'linear: 0.05 x 64/32'."""
    o = cfg.optim
    if o.lr_scaling == "none":
        return "lr_scaling none"
    ratio = f"{update_batch}/{o.ref_batch}"
    factor = ratio if o.lr_scaling == "linear" else f"sqrt({ratio})"
    return f"{o.lr_scaling}: {o.lr:g} x {factor}"


def bucket_bytes(cfg: Config, device: torch.device) -> int:
    """Flat gradient bucket size in bytes, or 0 for Horovod's DistributedOptimizer."""
    hc = cfg.horovod
    if hc.op == "adasum" or hc.compression != "none" or hc.bucket_mb == 0:
        return 0
    if hc.bucket_mb < 0:  # auto: measured on CPUs only (see hpcdp.grad_buckets)
        return 0 if device.type == "cuda" else CPU_BUCKET_BYTES
    return max(1, int(hc.bucket_mb * (1 << 20)))


def _distributed_optimizer(cfg: Config, model: torch.nn.Module, device: torch.device,
                           hvd: Any) -> Any:
    """The optimizer that averages gradients over ranks: flat buckets, or Horovod's own."""
    accum = cfg.horovod.backward_passes_per_step
    base = _optimizer(cfg, model)
    size = bucket_bytes(cfg, device)
    if size and hvd.size() > 1:  # one rank has nothing to average: no copies then
        try:
            return bucketed(base, size, accum, cfg.horovod.gradient_predivide_factor)
        except ValueError as e:  # parameters of several dtypes or devices
            log.warning(f"gradient buckets not used ({e}); Horovod's DistributedOptimizer is")
    adasum = cfg.horovod.op == "adasum"
    return hvd.DistributedOptimizer(
        base,
        named_parameters=model.named_parameters(),
        compression=hvd.Compression.fp16 if cfg.horovod.compression == "fp16"
        else hvd.Compression.none,
        backward_passes_per_step=accum,
        op=hvd.Adasum if adasum else hvd.Average,
        gradient_predivide_factor=cfg.horovod.gradient_predivide_factor,
    )


def _train_step(model: torch.nn.Module, optimizer: Any, scaler: Any, it: Iterator[Any],
                lr: float, totals: torch.Tensor, cfg: Config, device: torch.device,
                adasum: bool, trace: tuple[Any, int, int] | None, step: int = 0,
                nan: bool = False) -> tuple[float, float, float]:
    """One optimizer step over `accum` batches; returns (data, compute, comm) seconds.

    Horovod all-reduces gradients during backward; `synchronize()` waits for what
    did not overlap (counted as communication), then the step runs without a
    second synchronization (the pattern Horovod documents for AMP and clipping).
    Horovod's Adasum optimizer (several ranks) instead steps inside its hooks.
    """
    accum = cfg.horovod.backward_passes_per_step
    t_data = t_compute = 0.0
    optimizer.zero_grad()
    sched.set_lr(optimizer, lr)  # before backward: Adasum applies the local step in its hooks
    for _ in range(accum):
        t0 = time.perf_counter()
        watchdog.phase("data")
        xb, yb = next(it)
        if trace is not None:
            f, epoch, step = trace
            f.write(json.dumps({"epoch": epoch, "step": step, "ids": fingerprints(xb)}) + "\n")
        x, y = to_input(xb, cfg, device), yb.to(device, non_blocking=True)
        t1 = time.perf_counter()
        watchdog.phase("forward")
        with autocast(cfg, device):
            out = model(x)
            loss = F.cross_entropy(out.float(), y)
            if nan:  # an injected fault (tests)
                loss = faults.poison(loss)
        scaled = loss / accum
        watchdog.phase("backward")
        (scaler.scale(scaled) if scaler is not None else scaled).backward()
        with torch.no_grad():
            totals[0] += loss.double() * len(y)
            totals[1] += (out.argmax(1) == y).sum().double()
            totals[2] += len(y)
        t_data += t1 - t0
        t_compute += time.perf_counter() - t1
    t2 = time.perf_counter()
    watchdog.enter_collective("allreduce gradients")  # waits for what backward sent
    if adasum:  # step() waits for the combined deltas and applies them
        optimizer.step()
        if not _finite(p.data for p in model.parameters()):
            raise _nonfinite(step, cfg, "weights after an Adasum step", can_skip=False)
        return t_data, t_compute, time.perf_counter() - t2
    optimizer.synchronize()
    t3 = time.perf_counter()
    watchdog.phase("optimizer")
    # Gradients are averaged over ranks by now, so one rank's NaN is on every rank:
    # each decides alike without another collective. (A GradScaler skips such steps.)
    finite = scaler is not None or _finite(
        p.grad for p in model.parameters() if p.grad is not None)
    if not finite:
        if cfg.run.on_nan == "stop":
            raise _nonfinite(step, cfg, "loss or gradients", can_skip=True)
        log.warning(f"step {step}: non-finite loss or gradients on some rank; update skipped "
                    "(run.on_nan='skip')")
    if finite:
        with optimizer.skip_synchronize():
            if scaler is not None:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return t_data, t_compute + time.perf_counter() - t3, t3 - t2


def _finite(tensors: Iterator[torch.Tensor]) -> bool:
    """Whether every value is finite: one sum per tensor, one device sync for all.

    NaN and inf survive a sum (inf - inf is NaN), so a finite total means finite
    values. A sum can also overflow, but only for values around 1e32 and up, as
    fatal to training as inf. Every tensor is summed in fp32. Per step
    this is far cheaper than isfinite() on every value: ResNet-18 (2.8 M
    parameters, one core) 0.4 ms against 10 ms, which was about 10% of its step.
    """
    sums = [t.sum(dtype=torch.float32) for t in tensors]
    return bool(torch.isfinite(torch.stack(sums).sum())) if sums else True


def _nonfinite(step: int, cfg: Config, what: str, can_skip: bool) -> Exception:
    """The error every rank raises together when training produced NaN/inf (no save)."""
    from hpcdp.dist import AgreedError

    hint = " or set run.on_nan=skip to skip such updates" if can_skip else ""
    return AgreedError(
        f"step {step}: non-finite (NaN/inf) {what}; stopping without writing a checkpoint "
        f"(run.on_nan={cfg.run.on_nan!r}). The checkpoints in {cfg.checkpoint_dir} are "
        f"untouched: rerun to resume from the newest{hint}")


def _report_window(rep: Any, window: Any, totals: torch.Tensor, step: int, total_steps: int,
                   epoch: int, lr: float, size: int) -> None:
    """Collective: average loss/accuracy over ranks, then rank 0 logs and records."""
    from hpcdp import dist
    from hpcdp.metrics import rank_spread, spread_text

    loss_sum, correct, count = dist.allreduce_sum(totals.tolist(), name="hpcdp.train_metrics")
    totals.zero_()
    times = window.summary()
    times["samples_per_s"] *= size  # every rank processes the same number of samples
    spread = rank_spread(dist.gather_floats(times["busy_ms"], "hpcdp.busy")) if size > 1 else {}
    values = {"epoch": epoch, "loss": loss_sum / max(count, 1.0),
              "acc": correct / max(count, 1.0), "lr": lr, **times, **spread}
    rep.record("train", step, values)
    rep.info(f"step {step}/{total_steps} epoch {epoch} loss {values['loss']:.4f} "
             f"acc {values['acc']:.4f} lr {lr:.4g} | {times['samples_per_s']:.0f} samples/s, "
             f"step {times['step_ms']:.1f} ms (data {times['data_ms']:.1f}, compute "
             f"{times['compute_ms']:.1f}, comm {times['comm_ms']:.1f}){spread_text(spread)}")


def _optimizer(cfg: Config, model: torch.nn.Module) -> torch.optim.Optimizer:
    o = cfg.optim
    if o.name == "sgd":
        return torch.optim.SGD(model.parameters(), lr=o.lr, momentum=o.momentum,
                               nesterov=o.nesterov and o.momentum > 0, weight_decay=o.weight_decay)
    return torch.optim.AdamW(model.parameters(), lr=o.lr, weight_decay=o.weight_decay)


def _save(cfg: Config, step: int, epoch: int, model: torch.nn.Module, optimizer: Any,
          scaler: Any, reader: Any, schedule: sched.Schedule, size: int, root: bool,
          hvd: Any) -> Path:
    """Collective (RNG states gathered from every rank); rank 0 alone writes the file.

    A failed write (a full disk, a quota) stops the run on every rank with an error:
    a job that cannot checkpoint would lose all further work at its time limit, so
    it ends now, the previous checkpoint intact, for a rerun to resume from. Weights
    that are not finite are never written.
    """
    from hpcdp import dist

    watchdog.section("checkpoint")
    rngs = hvd.allgather_object(rng_state(), name="hpcdp.rng")
    path = ckpt.step_path(cfg.checkpoint_dir, step)
    error = None
    if root:
        try:
            _write_checkpoint(cfg, step, epoch, model, optimizer, scaler, reader, schedule,
                              size, rngs)
        except (OSError, ckpt.CheckpointError) as e:
            found = ckpt.list_checkpoints(cfg.checkpoint_dir)
            previous = f"the previous checkpoint {found[0][1]} is intact" if found else \
                "there is no earlier checkpoint"
            error = f"checkpoint {path} was not written ({e}); {previous}. " \
                "Free space (or fix the folder) and rerun the same command to resume"
    dist.agree(error, "save")
    return path


def _write_checkpoint(cfg: Config, step: int, epoch: int, model: torch.nn.Module,
                      optimizer: Any, scaler: Any, reader: Any, schedule: sched.Schedule,
                      size: int, rngs: list[Any]) -> None:
    """Rank 0: refuse non-finite weights, then write atomically."""
    weights = model.state_dict()
    if not _finite(t for t in weights.values() if t.is_floating_point()):
        raise ckpt.CheckpointError("the model holds NaN/inf values")
    state = {
        "format": 1, "step": step, "epoch": epoch, "model_name": cfg.model.name,
        "model": weights, "optimizer": optimizer.state_dict(),
        "schedule": dataclasses.asdict(schedule),
        "scaler": scaler.state_dict() if scaler is not None else None,
        "reader": reader.state_dict(), "rng": rngs, "config": cfg.to_dict(),
        "world_size": size, "time": time.time(),
    }
    ckpt.save(cfg.checkpoint_dir, step, state, cfg.checkpoint.keep)


def _load_state(state: dict[str, Any], model: torch.nn.Module, optimizer: Any, scaler: Any,
                reader: Any, rank: int, size: int, cfg: Config) -> tuple[int, int]:
    """Restore everything a checkpoint holds; returns (step, epoch)."""
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    if scaler is not None and state.get("scaler"):
        scaler.load_state_dict(state["scaler"])
    reader.load_state_dict(state["reader"])
    rngs = state.get("rng") or []
    if len(rngs) == size:
        set_rng_state(rngs[rank])
    else:  # another world size: fresh, distinct, reproducible streams per rank
        seed_everything(cfg.run.seed + rank + 1_000_003 * int(state["step"]))
    return int(state["step"]), int(state["epoch"])


if __name__ == "__main__":
    sys.exit(main())
