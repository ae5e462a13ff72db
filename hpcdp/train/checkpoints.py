"""The checkpoint manager: when to save, what goes in, keep-k, and the resume protocol.

The file format (checksummed, atomic) is hpcdp.train.checkpoint_format's, who may have
written a file hpcdp.train.checkpoint_trust's, the folder of numbered files
hpcdp.train.checkpoint_folder's; the policy is here:

- what a checkpoint holds is built in one place (`CheckpointManager.state`):
  model, optimizers, scaler, reader position, train state, every rank's RNG,
  training-metric sums since the last report and PowerSGD state (its residuals
  are per rank), the config and the schedule, and an own loop's extra state
  (hpcdp.session);
- the manager sees a run through `Parts`, the stateful parts and the names a
  checkpoint is checked against: the trainer's from its `setup.Run` (`of_run`),
  an own loop's from hpcdp.session;
- keep-k: after each write the newest `checkpoint.keep` files stay. A file that
  fails verification is moved aside as `*.corrupt` when a run looks for its
  checkpoint, so it never holds a slot that a good one needs;
- one run per folder: a fresh start (`resume=none`) into a folder that holds
  checkpoints, or a resume that would put this run's files beside another run's,
  is refused with what to do;
- resume: rank 0 chooses and verifies, broadcasts the bytes, every rank loads
  them, all agree that it worked; a checkpoint taken with another global batch
  is refused (its step count and schedule mean other samples).
"""

from __future__ import annotations

import dataclasses
import logging
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hpcdp import files
from hpcdp.config import Config
from hpcdp.runtime import dist, watchdog
from hpcdp.train import accel
from hpcdp.train import checkpoint_folder as ckfolder
from hpcdp.train import checkpoint_format as ckformat
from hpcdp.train import checkpoint_trust as cktrust
from hpcdp.train import schedule as sched
from hpcdp.train.numerics import finite
from hpcdp.train.setup import Run, seed_everything

log = logging.getLogger("hpcdp.train")

FORMAT = 2  # 2: "optimizers" (a list), "train" state, "global_batch", "task"


@dataclass
class Parts:
    """What a checkpoint saves and restores on one rank, and what names the run.

    The trainer's come from its `setup.Run` (`of_run`); a script with its own loop
    (hpcdp.session) gives its model, optimizers and reader, and `extra`: state of
    its own (rank 0's is saved, every rank gets it back)."""

    model: Any
    optimizers: list[Any]
    reader: Any  # a TrainingReader (hpcdp.data.read.protocol)
    rank: int
    size: int
    global_batch: int  # samples per optimizer step over all ranks
    task: str  # recorded; a resume under another task or model is refused
    model_name: str
    scaler: Any = None
    schedule: sched.Schedule | None = None
    extra: dict[str, Any] | None = None
    seed: int = 0  # run.seed: the RNG streams of a resume on another world size

    @property
    def root(self) -> bool:
        return self.rank == 0


def of_run(run: Run) -> Parts:
    """The trainer's parts."""
    return Parts(run.model, run.optimizers, run.train_reader, run.rank, run.size,
                 run.global_batch, run.cfg.task.name, run.cfg.model.name, run.scaler,
                 run.schedule, seed=run.cfg.run.seed)


@dataclass
class TrainState:
    """Where training stands: what a resumed run continues from."""

    step: int = 0
    epoch: int = 0
    samples_seen: int = 0

    def advance(self, global_batch: int) -> None:
        self.step += 1
        self.samples_seen += global_batch


# --------------------------------------------------------------------------- pure policy


def mixing_error(mode: str, folder: Path, listed: list[tuple[int, Path]]) -> str | None:
    """Why this run must not write into `folder`, given its checkpoints (pure, no I/O).

    `mode` is checkpoint.resume. Checkpoints of two runs in one folder prune each
    other (the higher step numbers win) and a later `resume=auto` picks the wrong run.
    """
    if not listed or mode == "auto":
        return None
    newest = listed[0][1]
    if mode == "none":
        return (f"checkpoint.resume=none, but {folder} already holds checkpoints (newest: "
                f"{newest.name}): a second run there would prune them or be pruned by them. "
                "Resume that run (checkpoint.resume=auto), give this run its own folder "
                "(run.dir=... or checkpoint.dir=...), or move those files away")
    path = Path(mode)
    if path.resolve().parent != folder.resolve():
        return (f"checkpoint.resume={mode}: resuming another run's checkpoint into {folder}, "
                f"which holds checkpoints of its own (newest: {newest.name}); give this run "
                "its own folder (run.dir=... or checkpoint.dir=...) or move those files away")
    m = ckfolder.NAME_RE.match(path.name)
    own_step = int(m.group(1)) if m else -1
    newer = [p.name for s, p in listed if s > own_step]
    if newer:
        return (f"checkpoint.resume={mode}: {folder} holds newer checkpoints "
                f"({', '.join(newer[:3])}) that would outrank this run's; resume the newest "
                "(checkpoint.resume=auto) or move the newer files away")
    return None


def stored_global_batch(state: dict[str, Any]) -> int | None:
    """Samples per optimizer step of the run that wrote `state` (older files: from its config)."""
    if "global_batch" in state:
        return int(state["global_batch"])
    try:
        data, hc = state["config"]["data"], state["config"]["horovod"]
        per_step = data["global_batch_size"] or data["batch_size"] * int(state["world_size"])
        return int(per_step) * int(hc["backward_passes_per_step"])
    except (KeyError, TypeError, ValueError):
        return None


def batch_change_error(stored: int | None, current: int, name: str) -> str | None:
    """Why a run with global batch `current` must not resume a checkpoint of batch `stored`.

    The step counter, the schedule (built from steps per epoch) and the reader's
    position all count optimizer steps of the stored batch. Whoever adds a way to
    allow such a resume (rescaling by samples seen) gates it here.
    """
    if stored is None or stored == current:
        return None
    return (f"{name} was written with a global batch of {stored} samples per step, but this "
            f"run takes {current}; its step count and learning-rate schedule would not match. "
            f"Resume with the same global batch (data.global_batch_size={stored}, or "
            "data.batch_size x ranks x horovod.backward_passes_per_step), start a new run "
            "in another folder, or set optim.allow_lr_change=true to resume anyway")


def not_written_error(path: Path, error: Exception, folder: Path) -> str:
    found = ckfolder.list_checkpoints(folder)
    previous = (f"the previous checkpoint {found[0][1]} is intact" if found
                else "there is no earlier checkpoint")
    return (f"checkpoint {path} was not written ({error}); {previous}. Free space (or fix the "
            "folder) and rerun the same command to resume")


def holds_tensors(optimizers: list[Any]) -> bool:
    """Whether any optimizer keeps tensors per parameter (momentum, Adam's moments)."""
    return any(hasattr(v, "shape") for opt in optimizers for st in opt.state.values()
               for v in st.values())


def compression_states(optimizers: list[Any]) -> list[Any]:
    """This rank's compression state of each optimizer (PowerSGD's), None for the others."""
    return [opt.compression_state() if hasattr(opt, "compression_state") else None
            for opt in optimizers]


def load_compression(run: Parts, saved: list[Any]) -> list[str]:
    """Restore each optimizer's PowerSGD state from a checkpoint's per-rank `saved` states;
    returns what could not be restored, for rank 0 to warn about.

    The same world size: every rank its own residuals, so the resume is exact. Another:
    the residuals belong to ranks that no longer exist (and summed they are one step's
    error at most), so they are dropped; Q, the same on every rank, and the step count
    (so the warm-up does not start again) are kept.
    """
    notes = []
    same_world = len(saved) == run.size
    mine = saved[run.rank] if same_world else saved[0] if saved else None
    for k, opt in enumerate(run.optimizers):
        state = mine[k] if mine is not None and k < len(mine) else None
        if not hasattr(opt, "load_compression_state"):
            if state is not None:
                notes.append("the checkpoint holds PowerSGD state that this run does not use")
            continue
        if state is None:
            notes.append("the checkpoint holds no PowerSGD state: Q factors and residuals "
                         "start afresh, with the warm-up")
            continue
        note = opt.load_compression_state(state, residuals=same_world)
        if note:
            notes.append(note)
        elif not same_world:
            notes.append(f"PowerSGD residuals dropped: the checkpoint was written by "
                         f"{len(saved)} rank(s), this run has {run.size} (Q factors kept)")
    return notes


# --------------------------------------------------------------------------- RNG state and fit


def capture_rng() -> dict[str, Any]:
    """This process's random generators as tensors and plain values (see restore_rng)."""
    state: dict[str, Any] = {
        "python": random.getstate(),  # (version, 625 ints, gauss or None)
        "numpy": ckformat.to_safe(np.random.get_state()),  # (name, keys as an int64 tensor, ...)
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    """Set the generators to what capture_rng saw (also from a converted legacy checkpoint)."""
    version, internal, gauss = state["python"]
    random.setstate((int(version), tuple(int(v) for v in internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((str(name), np.asarray(keys, dtype=np.uint32), int(pos),
                         int(has_gauss), float(cached)))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def check_compatible(state: dict[str, Any], model: torch.nn.Module, model_name: str,
                     name: str) -> None:
    """Refuse a checkpoint written for another model (by name, then by tensor shapes)."""
    saved_name = state.get("model_name")
    if saved_name != model_name:
        raise ckformat.CheckpointError(
            f"{name} was written for model {saved_name!r}, but this run builds {model_name!r}"
        )
    saved = state.get("model")
    if not isinstance(saved, dict):
        raise ckformat.CheckpointError(f"{name} holds no model state")
    saved = accel.without_compile_prefix(saved)
    own = model.state_dict()
    missing = sorted(set(own) - set(saved))
    extra = sorted(set(saved) - set(own))
    if missing or extra:
        raise ckformat.CheckpointError(
            f"{name} does not fit model {model_name!r}: missing {missing[:3]}, unexpected "
            f"{extra[:3]} (different width or options?)"
        )
    for key, tensor in own.items():
        if tuple(saved[key].shape) != tuple(tensor.shape):
            raise ckformat.CheckpointError(
                f"{name} does not fit model {model_name!r}: {key} has shape "
                f"{tuple(saved[key].shape)} there, {tuple(tensor.shape)} here"
            )


# --------------------------------------------------------------------------- the manager


class CheckpointManager:
    """Owns a run's checkpoint folder: saving, keeping, choosing and loading."""

    def __init__(self, cfg: Config, root: bool) -> None:
        self.cfg = cfg
        self.folder = cfg.checkpoint_dir
        self.keep = cfg.checkpoint.keep
        self.every = cfg.checkpoint.every_steps
        self.root = root
        self.trust = cktrust.Trust(cfg.checkpoint.allow_group_write,
                                   cfg.checkpoint.strict_permissions)
        # This rank's training-metric sums from the checkpoint resumed (MetricSums), or None
        self.metric_sums: dict[str, Any] | None = None

    def due(self, step: int, total_steps: int, stopping: bool) -> bool:
        """Whether to write a checkpoint after `step` (the same answer on every rank)."""
        return stopping or step == total_steps or bool(self.every and step % self.every == 0)

    def path(self, step: int) -> Path:
        return ckfolder.step_path(self.folder, step)

    def state(self, run: Parts, train: TrainState, rngs: list[Any],
              metric_sums: list[Any], compression: list[Any] | None = None) -> dict[str, Any]:
        """Everything a checkpoint holds: the one place its contents are decided."""
        return {
            "format": FORMAT, "task": run.task, "model_name": run.model_name,
            "step": train.step, "epoch": train.epoch,
            "train": dataclasses.asdict(train), "global_batch": run.global_batch,
            "model": run.model.state_dict(),
            "optimizers": [opt.state_dict() for opt in run.optimizers],
            "scaler": run.scaler.state_dict() if run.scaler is not None else None,
            "reader": run.reader.state_dict(),
            "schedule": dataclasses.asdict(run.schedule) if run.schedule is not None else None,
            "rng": rngs, "metric_sums": metric_sums, "extra": run.extra,
            # per rank, per optimizer: PowerSGD's Q factors and this rank's residuals, or None
            "compression": compression,
            "config": self.cfg.to_dict(), "world_size": run.size,
            # what the task's build_model was given: a model is rebuilt from it (export)
            "sample_shape": list(getattr(run.reader, "sample_shape", None) or []),
            "time": time.time(),
        }

    # -- saving -------------------------------------------------------------------------

    def save(self, run: Parts, train: TrainState,
             metric_sums: dict[str, Any] | None = None) -> tuple[Path, str | None]:
        """Collective (every rank's RNG and metric sums are gathered); rank 0 alone writes.

        A failed write (a full disk, a quota) stops the run on every rank with an
        error: a job that cannot checkpoint would lose all further work at its time
        limit, so it ends now, the previous checkpoint intact, for a rerun to resume
        from. Non-finite weights are never written. Returns the path and, on rank 0,
        a warning when something after the write failed (the file is complete).
        """
        watchdog.section("checkpoint")
        every = dist.allgather_object((capture_rng(), metric_sums,
                                       compression_states(run.optimizers)), "hpcdp.rng")
        path, error, note = self.path(train.step), None, None
        if self.root:
            try:
                state = self.state(run, train, [r for r, _, _ in every],
                                   [m for _, m, _ in every], [c for _, _, c in every])
                note = self.write(path, state)
            except (OSError, ckformat.CheckpointError) as e:
                error = not_written_error(path, e, self.folder)
        dist.agree(error, "save")
        return path, note

    def write(self, path: Path, state: dict[str, Any]) -> str | None:
        """Rank 0: write `path` atomically, then keep the newest `keep`.

        Raises if the file was not written; returns a warning (the file is whole)
        when only the folder's fsync or the pruning failed.
        """
        weights = state["model"]
        if not finite(t for t in weights.values() if t.is_floating_point()):
            raise ckformat.CheckpointError("the model holds NaN/inf values")
        ckformat.replace_atomic(path, ckformat.encode(state))
        try:
            files.sync_folder(self.folder)
            ckfolder.prune(self.folder, self.keep)
        except OSError as e:
            return (f"checkpoint {path} was written, but syncing or pruning {self.folder} "
                    f"failed afterwards: {e}")
        return None

    # -- resuming -----------------------------------------------------------------------

    def newest_verified(self) -> tuple[ckfolder.Found | None, list[str]]:
        """Rank 0: the newest file that verifies; corrupt newer ones are moved aside.

        A folder or file that others could have written is refused (UntrustedError),
        not skipped: someone should look at it before anything resumes.
        """
        notes = []
        if self.folder.is_dir():
            cktrust.check_trusted(self.folder.resolve(), self.trust)
        for step, path in ckfolder.list_checkpoints(self.folder):
            try:
                return ckfolder.Found(path, step, cktrust.read_verified(path, self.trust)), notes
            except cktrust.UntrustedError:
                raise
            except ckformat.CheckpointError as e:
                if ckfolder.is_corrupt(path):
                    notes.append(f"skipping checkpoint: {e}; moved aside to "
                                 f"{ckfolder.set_aside(path).name}")
                else:
                    notes.append(f"skipping checkpoint: {e}")
        return None, notes

    def choose(self, run: Parts) -> dict[str, Any]:
        """Rank 0 only: what to resume from, as a message every rank can act on."""
        mode = self.cfg.checkpoint.resume
        try:
            why = mixing_error(mode, self.folder, ckfolder.list_checkpoints(self.folder))
            if why:
                return {"kind": "error", "message": why}
            if mode == "none":
                return {"kind": "fresh"}
            if mode == "auto":
                found, notes = self.newest_verified()
                if found is None:
                    return {"kind": "fresh", "notes": notes}
                path, data = found.path, found.data
            else:
                path, notes = Path(mode), []
                data = cktrust.read_verified(path, self.trust)
            name = f"checkpoint {str(path)!r}"
            self.check(ckformat.decode(data, str(path)), run, name)
            return {"kind": "resume", "path": str(path), "data": data, "notes": notes}
        except (ckformat.CheckpointError, OSError) as e:
            return {"kind": "error", "message": str(e)}

    def check(self, state: dict[str, Any], run: Parts, name: str) -> None:
        """Refuse a checkpoint of another task, model or global batch."""
        task = state.get("task", "image")
        if task != run.task:
            raise ckformat.CheckpointError(f"{name} was written for task {task!r}, but this run "
                                           f"is task {run.task!r}")
        check_compatible(state, run.model, run.model_name, name)
        if self.cfg.optim.allow_lr_change:  # the user accepts another batch and rate knowingly
            return
        why = batch_change_error(stored_global_batch(state), run.global_batch, name)
        if why:
            raise ckformat.CheckpointError(why)
        if run.schedule is None:  # an own loop's rate is its own business
            return
        why = sched.lr_change_on_resume(state.get("schedule") or {}, run.schedule)
        if why:
            raise ckformat.CheckpointError(f"{name}: {why}")

    def resume(self, run: Parts) -> tuple[TrainState, str | None]:
        """Collective: rank 0 chooses, broadcasts the bytes, every rank loads, all agree."""
        decision = self.choose(run) if self.root else None
        decision = dist.broadcast_object(decision, "hpcdp.resume")
        if decision["kind"] == "error":
            raise dist.AgreedError(decision["message"])
        for note in decision.get("notes", []):
            log.warning(note)
        if decision["kind"] == "fresh":
            return TrainState(), None
        error, train = None, TrainState()
        try:
            train = self.load(ckformat.decode(decision["data"], decision["path"]), run)
        except Exception as e:  # noqa: BLE001 - e.g. a reader state this world cannot use
            error = f"checkpoint {decision['path']!r} cannot be resumed here: {e}"
        dist.agree(error, "resume")
        return train, decision["path"]

    def load(self, state: dict[str, Any], run: Parts) -> TrainState:
        """Restore every part a checkpoint holds on this rank; returns the train state."""
        run.model.load_state_dict(accel.without_compile_prefix(state["model"]))
        saved = state["optimizers"] if "optimizers" in state else [state["optimizer"]]
        if len(saved) != len(run.optimizers):
            raise ckformat.CheckpointError(f"it holds {len(saved)} optimizer state(s), this run "
                                           f"has {len(run.optimizers)} optimizer(s)")
        for opt, opt_state in zip(run.optimizers, saved, strict=True):
            opt.load_state_dict(opt_state)
        if run.scaler is not None and state.get("scaler"):
            run.scaler.load_state_dict(state["scaler"])
        run.reader.load_state_dict(state["reader"])
        if run.extra is not None:  # rank 0's, on every rank: the same on any world size
            run.extra.clear()
            run.extra.update(state.get("extra") or {})
        rngs = state.get("rng") or []
        if len(rngs) == run.size:
            restore_rng(rngs[run.rank])
        else:  # another world size: fresh, distinct, reproducible streams per rank
            seed_everything(run.seed + run.rank + 1_000_003 * int(state["step"]))
        sums = state.get("metric_sums") or []  # another world size: the window starts afresh
        self.metric_sums = sums[run.rank] if len(sums) == run.size else None
        for note in load_compression(run, state.get("compression") or []):
            if self.root:
                log.warning(note)
        if self.root and self.cfg.horovod.op == "adasum" and run.size > 1 \
                and holds_tensors(run.optimizers):
            log.warning("horovod.op=adasum: each rank's optimizer state (momentum, moments) "
                        "grew from its own gradients; the checkpoint holds rank 0's, which every "
                        "rank resumes from, so this run departs from an uninterrupted one")
        step = int(state["step"])
        train = state.get("train") or {}
        return TrainState(step, int(state["epoch"]),
                          int(train.get("samples_seen", step * run.global_batch)))
