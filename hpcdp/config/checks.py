"""The checks a built config passes before any data, model or runtime: ranges, choices
and the relations between keys."""

from __future__ import annotations

import importlib.util
import math
import os
from collections.abc import Mapping

from hpcdp import profile_spec
from hpcdp.config.schema import (
    CHOICES,
    SIGNAL_NAMES,
    Config,
    ConfigError,
    HorovodConfig,
    RunConfig,
    find_task,
)
from hpcdp.config.values import _unknown


def _choices(cfg: Config) -> dict[str, tuple[str, ...]]:
    """CHOICES and the task's own, as {"section.key": allowed}."""
    section = find_task(cfg.task.name).section
    own = {f"{section.key}.{k}": v for k, v in section.choices.items()} if section else {}
    return {**CHOICES, **own}


def validate(cfg: Config) -> None:
    """Range and choice checks that need no data, no model and no runtime."""
    task = find_task(cfg.task.name)
    for key, allowed in _choices(cfg).items():
        sec, name = key.split(".")
        value = getattr(getattr(cfg, sec), name)
        if value not in allowed:
            raise ConfigError(f"{key}={value!r}: choose one of {', '.join(allowed)}")
    positive = {
        "run.epochs": cfg.run.epochs,
        "data.batch_size": cfg.data.batch_size,
        "optim.ref_batch": cfg.optim.ref_batch,
        "horovod.backward_passes_per_step": cfg.horovod.backward_passes_per_step,
        "checkpoint.keep": cfg.checkpoint.keep,
        "preempt.check_every": cfg.preempt.check_every,
        "log.every_steps": cfg.log.every_steps,
    }
    at_least_one(positive)
    non_negative = {
        "run.max_steps": cfg.run.max_steps,
        "run.stop_at_step": cfg.run.stop_at_step,
        "data.global_batch_size": cfg.data.global_batch_size,
        "data.val_batch_size": cfg.data.val_batch_size,
        "data.window_samples": cfg.data.window_samples,
        "data.virtual_shards": cfg.data.virtual_shards,
        "data.prefetch": cfg.data.prefetch,
        "checkpoint.every_steps": cfg.checkpoint.every_steps,
        "schedule.warmup_epochs": cfg.schedule.warmup_epochs,
        "optim.weight_decay": cfg.optim.weight_decay,
        "preempt.max_requeues": cfg.preempt.max_requeues,
        "optim.grad_clip": cfg.optim.grad_clip,
    }
    not_negative(non_negative)
    if not cfg.data.path:
        raise ConfigError("data.path is not set: the folder holding the training data")
    if cfg.optim.lr <= 0:
        raise ConfigError(f"optim.lr={cfg.optim.lr}: must be positive")
    if cfg.horovod.gradient_predivide_factor <= 0:
        raise ConfigError("horovod.gradient_predivide_factor must be positive")
    if cfg.horovod.op == "adasum" and cfg.horovod.gradient_predivide_factor != 1.0:
        raise ConfigError("horovod.gradient_predivide_factor must be 1.0 with horovod.op='adasum'")
    if cfg.horovod.op == "adasum" and cfg.run.precision == "fp16":
        raise ConfigError("horovod.op='adasum' cannot be combined with run.precision='fp16' "
                          "(Adasum steps inside its hooks, where a GradScaler cannot act)")
    if cfg.schedule.kind == "step" and not cfg.schedule.milestones:
        raise ConfigError("schedule.kind='step' needs schedule.milestones (epochs)")
    if sorted(cfg.schedule.milestones) != cfg.schedule.milestones:
        raise ConfigError(f"schedule.milestones={cfg.schedule.milestones}: must be increasing")
    if not 0.0 <= cfg.schedule.warmup_start_factor <= 1.0:
        raise ConfigError("schedule.warmup_start_factor must lie in [0, 1]")
    if not 0.0 <= cfg.schedule.min_factor <= 1.0:
        raise ConfigError("schedule.min_factor must lie in [0, 1]")
    for sig in cfg.preempt.signals:
        if sig not in SIGNAL_NAMES:
            raise ConfigError(f"preempt.signals: {sig!r} is not one of {', '.join(SIGNAL_NAMES)}")
    _check_stall_keys(cfg)
    error = horovod_stall_error(cfg.horovod, os.environ)
    if error:
        raise ConfigError(error)
    if cfg.run.precision == "fp16" and cfg.run.device == "cpu":
        raise ConfigError("run.precision='fp16' needs a GPU (use bf16 or fp32 on CPUs)")
    _validate_more(cfg)
    if task.section is not None and task.section.check is not None:
        task.section.check(cfg)


def at_least_one(values: Mapping[str, float]) -> None:
    """Raise ConfigError naming the first key ("run.epochs") whose value is below 1."""
    for key, value in values.items():
        if value < 1:
            raise ConfigError(f"{key}={value}: must be at least 1")


def not_negative(values: Mapping[str, float]) -> None:
    """Raise ConfigError naming the first key whose value is below 0."""
    for key, value in values.items():
        if value < 0:
            raise ConfigError(f"{key}={value}: must not be negative")


def not_empty(values: Mapping[str, str]) -> None:
    """Raise ConfigError naming the first key whose value is the empty string."""
    for key, value in values.items():
        if not value:
            raise ConfigError(f"{key} must not be empty")


def _validate_more(cfg: Config) -> None:
    """Ranges the optimizer, the seed and the run folder would otherwise reject mid-setup."""
    if not 0 <= cfg.run.seed < 2**63:
        raise ConfigError(f"run.seed={cfg.run.seed}: must lie in [0, 2**63)")
    if cfg.optim.momentum < 0:
        raise ConfigError(f"optim.momentum={cfg.optim.momentum}: must not be negative")
    if cfg.optim.name == "sgd" and cfg.optim.nesterov and cfg.optim.momentum == 0:
        raise ConfigError("optim.nesterov=true needs a positive optim.momentum")
    _validate_optim(cfg)
    _validate_powersgd(cfg.horovod, cfg.run.precision)
    if cfg.schedule.gamma <= 0:
        raise ConfigError(f"schedule.gamma={cfg.schedule.gamma}: must be positive")
    if any(m < 0 for m in cfg.schedule.milestones):
        raise ConfigError(f"schedule.milestones={cfg.schedule.milestones}: must not be negative")
    name = cfg.run.name
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise ConfigError(f"run.name={name!r}: must be a plain folder name (set run.dir for a "
                          "path)")
    not_empty({"data.train_file": cfg.data.train_file, "data.val_file": cfg.data.val_file,
               "checkpoint.resume": cfg.checkpoint.resume})
    _validate_staging(cfg)
    try:
        profile_spec.parse(cfg.run.profile)
    except profile_spec.ProfileSpecError as e:
        raise ConfigError(str(e)) from None
    _validate_trackers(cfg.run)
    for key in ("run.dir", "data.path", "checkpoint.dir", "checkpoint.resume", "horovod.timeline",
                "data.stage_dir"):
        sec, attr = key.split(".")
        if "\0" in getattr(getattr(cfg, sec), attr):
            raise ConfigError(f"{key} must not hold a NUL character")


#: Experiment trackers (hpcdp.train.tracking), each with the module its extra installs.
TRACKERS = {"mlflow": "mlflow", "wandb": "wandb"}


def _validate_trackers(run: RunConfig) -> None:
    """Known tracker names, each once and installed; a project name; a bound that is one."""
    for name in run.trackers:
        if name not in TRACKERS:
            raise _unknown("tracker", name, list(TRACKERS), "in run.trackers")
        if importlib.util.find_spec(TRACKERS[name]) is None:
            raise ConfigError(f"run.trackers names {name!r}, but its package is not installed: "
                              f"pip install 'hpcdp[{name}]'")
    if len(set(run.trackers)) != len(run.trackers):
        raise ConfigError(f"run.trackers={run.trackers}: a tracker is named twice")
    if run.tracker_model and not run.trackers:
        raise ConfigError("run.tracker_model=true logs the model to the trackers, but "
                          "run.trackers is empty")
    if run.trackers and not run.tracker_project:
        raise ConfigError("run.tracker_project must not be empty with run.trackers set")
    for key in ("tracker_close_timeout_s", "tracker_connect_timeout_s"):
        if not 0 <= getattr(run, key) < math.inf:
            raise ConfigError(f"run.{key}={getattr(run, key):g}: must be a finite number of "
                              "seconds, at least 0")


def stage_name_error(key: str, name: str) -> str | None:
    """Why a data file name cannot be staged (it must stay inside the stage dir), or None."""
    parts = name.replace("\\", "/").split("/")
    if os.path.isabs(name) or ".." in parts:
        return (f"{key}={name!r}: with data.stage_dir set, the file must be a path inside "
                "data.path (relative, without '..'), so that its copy lands inside the "
                "stage dir")
    return None


def _validate_powersgd(hc: HorovodConfig, precision: str) -> None:
    """The PowerSGD keys' ranges, and what PowerSGD cannot be combined with."""
    if hc.powersgd_rank < 1:
        raise ConfigError(f"horovod.powersgd_rank={hc.powersgd_rank}: must be at least 1")
    not_negative({"horovod.powersgd_warmup_steps": hc.powersgd_warmup_steps,
                  "horovod.powersgd_min_elements": hc.powersgd_min_elements})
    if hc.compression != "powersgd":
        return
    if hc.op == "adasum":
        raise ConfigError("horovod.compression='powersgd' cannot be combined with "
                          "horovod.op='adasum' (PowerSGD averages)")
    if hc.gradient_predivide_factor != 1.0:
        raise ConfigError("horovod.gradient_predivide_factor must be 1.0 with "
                          "horovod.compression='powersgd' (its factors are summed, then divided)")
    if precision == "fp16":
        raise ConfigError("horovod.compression='powersgd' cannot be combined with "
                          "run.precision='fp16': the residuals would carry the loss scale from "
                          "step to step (use bf16)")


def _validate_staging(cfg: Config) -> None:
    """File names that keep their copies inside data.stage_dir (expanded later, per node)."""
    if not cfg.data.stage_dir:
        return
    for key in ("data.train_file", "data.val_file"):
        error = stage_name_error(key, getattr(cfg.data, key.split(".")[1]))
        if error:
            raise ConfigError(error)


def _validate_optim(cfg: Config) -> None:
    """Betas, clipping (which needs the averaged gradients), LARS's trust, the power."""
    betas = cfg.optim.betas
    if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
        raise ConfigError(f"optim.betas={betas}: two numbers in [0, 1)")
    if cfg.optim.grad_clip > 0 and cfg.horovod.op == "adasum":
        raise ConfigError("optim.grad_clip cannot be combined with horovod.op='adasum' (Adasum "
                          "steps inside its hooks, before any averaged gradient exists)")
    if cfg.optim.trust_coefficient <= 0:
        raise ConfigError(f"optim.trust_coefficient={cfg.optim.trust_coefficient}: must be "
                          "positive")
    if cfg.schedule.power <= 0:
        raise ConfigError(f"schedule.power={cfg.schedule.power}: must be positive")
    _validate_bf16(cfg.horovod)


def _validate_bf16(hc: HorovodConfig) -> None:
    """bf16 compression travels in hpcdp's gradient buckets, which average (no Adasum)."""
    if hc.compression != "bf16":
        return
    if hc.op == "adasum":
        raise ConfigError("horovod.compression='bf16' cannot be combined with "
                          "horovod.op='adasum' (bf16 travels in hpcdp's averaging buckets)")
    if hc.bucket_mb == 0:
        raise ConfigError("horovod.compression='bf16' needs hpcdp's gradient buckets "
                          "(Horovod 0.28 all-reduces no bf16): set horovod.bucket_mb to a "
                          "size in MiB or -1, not 0")


def check_paths(cfg: Config) -> None:
    """Paths that exist but are the wrong kind (a file where a folder belongs, or back).

    Paths that do not exist yet are fine here: the run creates its folders, and
    the data checks name a missing file on every rank before any collective.
    """
    folders = {"data.path": cfg.data.path, "run.dir": str(cfg.run_dir),
               "checkpoint.dir": str(cfg.checkpoint_dir)}
    for key, folder in folders.items():
        if os.path.exists(folder) and not os.path.isdir(folder):
            raise ConfigError(f"{key}: {folder!r} is a file, not a folder")
    files = {"data.train_file": os.path.join(cfg.data.path, cfg.data.train_file),
             "data.val_file": os.path.join(cfg.data.path, cfg.data.val_file)}
    if cfg.checkpoint.resume not in ("auto", "none"):
        files["checkpoint.resume"] = cfg.checkpoint.resume
    if cfg.horovod.timeline:
        files["horovod.timeline"] = str(cfg.run_dir / cfg.horovod.timeline)
    for key, file in files.items():
        if os.path.isdir(file):
            raise ConfigError(f"{key}: {file!r} is a folder, not a file")


def _check_stall_keys(cfg: Config) -> None:
    run = cfg.run
    if run.stall_floor_s <= 0:
        raise ConfigError(f"run.stall_floor_s={run.stall_floor_s:g}: must be positive "
                          "(turn the watchdog off with run.step_timeout_s=0)")
    for key, value in (("run.stall_multiple", run.stall_multiple),
                       ("run.stall_warmup_factor", run.stall_warmup_factor)):
        if value < 1:
            raise ConfigError(f"{key}={value:g}: must be at least 1")


HOROVOD_STALL_CHECK_DEFAULT_S = 60


CHECK_ENV, SHUTDOWN_ENV = "HOROVOD_STALL_CHECK_TIME_SECONDS", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"


def horovod_stall_error(hc: HorovodConfig, environ: Mapping[str, str]) -> str | None:
    """Why Horovod would not act on these stall settings as written, or None (pure).

    Horovod reads both as whole seconds and ignores a shutdown time below the check
    time (it logs "will not shutdown" every check and waits forever). A key left
    negative takes the environment's variable, else Horovod's default.
    """
    for key, value in (("horovod.stall_check_s", hc.stall_check_s),
                       ("horovod.stall_shutdown_s", hc.stall_shutdown_s)):
        if value >= 0 and value != int(value):
            return f"{key}={value:g}: Horovod reads whole seconds; use an integer"
    check, check_from = _stall_value(hc.stall_check_s, "horovod.stall_check_s", CHECK_ENV,
                                     environ, HOROVOD_STALL_CHECK_DEFAULT_S)
    shutdown, shutdown_from = _stall_value(hc.stall_shutdown_s, "horovod.stall_shutdown_s",
                                           SHUTDOWN_ENV, environ, 0)
    if check is None or shutdown is None:
        bad = CHECK_ENV if check is None else SHUTDOWN_ENV
        return f"{bad}={environ.get(bad)!r} in the environment is not a whole number of seconds"
    if 0 < shutdown < check:
        return (f"{shutdown_from}={shutdown} is below the stall check time ({check_from}={check}): "
                f"Horovod ignores such a shutdown time and the job would wait forever. Set "
                f"horovod.stall_check_s to at most {shutdown} (e.g. horovod.stall_check_s="
                f"{max(1, shutdown // 2)}) or horovod.stall_shutdown_s to at least {check}")
    return None


def _stall_value(value: float, key: str, env: str, environ: Mapping[str, str],
                 default: int) -> tuple[int | None, str]:
    """(whole seconds, where it came from) for one of Horovod's stall settings."""
    if value >= 0:
        return int(value), key
    if env in environ:
        try:
            return int(environ[env]), env
        except ValueError:
            return None, env
    return default, f"Horovod's default {env}"
