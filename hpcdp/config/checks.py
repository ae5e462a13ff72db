"""The checks a built config passes before any data, model or runtime: ranges, choices
and the relations between keys.

Each shared section has its own check, given that section's values and, where Horovod
reads the environment too ([horovod]'s stall times), the environment as an argument,
so that each can be called alone; `validate` runs them in the sections' order, then
the checks that relate keys of two sections, then the task's own section.
"""

from __future__ import annotations

import importlib.util
import math
import os
from collections.abc import Mapping
from typing import Any

from hpcdp import profile_spec
from hpcdp.config.schema import (
    CHOICES,
    SIGNAL_NAMES,
    CheckpointConfig,
    Config,
    ConfigError,
    DataConfig,
    HorovodConfig,
    LogConfig,
    OptimConfig,
    PreemptConfig,
    RunConfig,
    ScheduleConfig,
    find_task,
)
from hpcdp.config.values import _unknown


def validate(cfg: Config, environ: Mapping[str, str]) -> None:
    """Range and choice checks that need no data, no model and no runtime.

    `environ` is the environment the job will run in (build's): Horovod reads its stall
    times from there when the config leaves them negative.
    """
    check_run(cfg.run)
    check_data(cfg.data)
    check_optim(cfg.optim)
    check_schedule(cfg.schedule)
    check_horovod(cfg.horovod, environ)
    check_checkpoint(cfg.checkpoint)
    check_preempt(cfg.preempt)
    check_log(cfg.log)
    check_across_sections(cfg)
    check_task_section(cfg)


def check_choices(sec: str, values: Any,
                  choices: Mapping[str, tuple[str, ...]] = CHOICES) -> None:
    """Raise ConfigError for the first key of section `sec` whose value is not one of its
    choices (`choices` as {"section.key": allowed})."""
    for key, allowed in choices.items():
        owner, name = key.split(".")
        if owner != sec:
            continue
        value = getattr(values, name)
        if value not in allowed:
            raise ConfigError(f"{key}={value!r}: choose one of {', '.join(allowed)}")


def _no_nul(sec: str, values: Any, names: tuple[str, ...]) -> None:
    """Paths go to the OS, which cuts a string at its first NUL."""
    for name in names:
        if "\0" in getattr(values, name):
            raise ConfigError(f"{sec}.{name} must not hold a NUL character")


def check_run(run: RunConfig) -> None:
    """[run]: its choices, length, seed, folder name, watchdog, profile and trackers."""
    check_choices("run", run)
    at_least_one({"run.epochs": run.epochs})
    not_negative({"run.max_steps": run.max_steps, "run.stop_at_step": run.stop_at_step})
    _check_stall_keys(run)
    if run.precision == "fp16" and run.device == "cpu":
        raise ConfigError("run.precision='fp16' needs a GPU (use bf16 or fp32 on CPUs)")
    if not 0 <= run.seed < 2**63:
        raise ConfigError(f"run.seed={run.seed}: must lie in [0, 2**63)")
    name = run.name
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise ConfigError(f"run.name={name!r}: must be a plain folder name (set run.dir for a "
                          "path)")
    try:
        profile_spec.parse(run.profile)
    except profile_spec.ProfileSpecError as e:
        raise ConfigError(str(e)) from None
    _check_trackers(run)
    _no_nul("run", run, ("dir",))


def _check_stall_keys(run: RunConfig) -> None:
    if run.stall_floor_s <= 0:
        raise ConfigError(f"run.stall_floor_s={run.stall_floor_s:g}: must be positive "
                          "(turn the watchdog off with run.step_timeout_s=0)")
    for key, value in (("run.stall_multiple", run.stall_multiple),
                       ("run.stall_warmup_factor", run.stall_warmup_factor)):
        if value < 1:
            raise ConfigError(f"{key}={value:g}: must be at least 1")


def check_data(data: DataConfig) -> None:
    """[data]: the batch, the reader's counts, the folder and files, the stage folder."""
    check_choices("data", data)
    at_least_one({"data.batch_size": data.batch_size})
    not_negative({
        "data.global_batch_size": data.global_batch_size,
        "data.val_batch_size": data.val_batch_size,
        "data.window_samples": data.window_samples,
        "data.virtual_shards": data.virtual_shards,
        "data.prefetch": data.prefetch,
    })
    if not data.path:
        raise ConfigError("data.path is not set: the folder holding the training data")
    not_empty({"data.train_file": data.train_file, "data.val_file": data.val_file})
    _check_staging(data)
    _no_nul("data", data, ("path", "stage_dir"))


def _check_staging(data: DataConfig) -> None:
    """File names that keep their copies inside data.stage_dir (expanded later, per node)."""
    if not data.stage_dir:
        return
    for key in ("data.train_file", "data.val_file"):
        error = stage_name_error(key, getattr(data, key.split(".")[1]))
        if error:
            raise ConfigError(error)


def check_optim(optim: OptimConfig) -> None:
    """[optim]: the rate and its batch, decay, clipping, momentum, betas, LARS's trust."""
    check_choices("optim", optim)
    at_least_one({"optim.ref_batch": optim.ref_batch})
    not_negative({"optim.weight_decay": optim.weight_decay, "optim.grad_clip": optim.grad_clip})
    if optim.lr <= 0:
        raise ConfigError(f"optim.lr={optim.lr}: must be positive")
    if optim.momentum < 0:
        raise ConfigError(f"optim.momentum={optim.momentum}: must not be negative")
    if optim.name == "sgd" and optim.nesterov and optim.momentum == 0:
        raise ConfigError("optim.nesterov=true needs a positive optim.momentum")
    betas = optim.betas
    if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
        raise ConfigError(f"optim.betas={betas}: two numbers in [0, 1)")
    if optim.trust_coefficient <= 0:
        raise ConfigError(f"optim.trust_coefficient={optim.trust_coefficient}: must be "
                          "positive")


def check_schedule(schedule: ScheduleConfig) -> None:
    """[schedule]: warmup, the end factors, the polynomial's power, the steps' milestones."""
    check_choices("schedule", schedule)
    not_negative({"schedule.warmup_epochs": schedule.warmup_epochs})
    if schedule.kind == "step" and not schedule.milestones:
        raise ConfigError("schedule.kind='step' needs schedule.milestones (epochs)")
    if sorted(schedule.milestones) != schedule.milestones:
        raise ConfigError(f"schedule.milestones={schedule.milestones}: must be increasing")
    if any(m < 0 for m in schedule.milestones):
        raise ConfigError(f"schedule.milestones={schedule.milestones}: must not be negative")
    if not 0.0 <= schedule.warmup_start_factor <= 1.0:
        raise ConfigError("schedule.warmup_start_factor must lie in [0, 1]")
    if not 0.0 <= schedule.min_factor <= 1.0:
        raise ConfigError("schedule.min_factor must lie in [0, 1]")
    if schedule.gamma <= 0:
        raise ConfigError(f"schedule.gamma={schedule.gamma}: must be positive")
    if schedule.power <= 0:
        raise ConfigError(f"schedule.power={schedule.power}: must be positive")


def check_horovod(hc: HorovodConfig, environ: Mapping[str, str]) -> None:
    """[horovod]: accumulation, reduction, compression, and the stall times as Horovod
    will read them, from these keys or else from `environ`."""
    check_choices("horovod", hc)
    at_least_one({"horovod.backward_passes_per_step": hc.backward_passes_per_step})
    if hc.gradient_predivide_factor <= 0:
        raise ConfigError("horovod.gradient_predivide_factor must be positive")
    if hc.op == "adasum" and hc.gradient_predivide_factor != 1.0:
        raise ConfigError("horovod.gradient_predivide_factor must be 1.0 with horovod.op='adasum'")
    error = horovod_stall_error(hc, environ)
    if error:
        raise ConfigError(error)
    _check_bf16(hc)
    _check_powersgd(hc)
    _no_nul("horovod", hc, ("timeline",))


def _check_bf16(hc: HorovodConfig) -> None:
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


def _check_powersgd(hc: HorovodConfig) -> None:
    """The PowerSGD keys' ranges, and the reduction PowerSGD cannot be combined with."""
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


def check_checkpoint(ck: CheckpointConfig) -> None:
    """[checkpoint]: how many are kept, how often, and a resume that names something."""
    check_choices("checkpoint", ck)
    at_least_one({"checkpoint.keep": ck.keep})
    not_negative({"checkpoint.every_steps": ck.every_steps})
    not_empty({"checkpoint.resume": ck.resume})
    _no_nul("checkpoint", ck, ("dir", "resume"))


def check_preempt(preempt: PreemptConfig) -> None:
    """[preempt]: the agreement's period, the requeue bound, signals that exist."""
    check_choices("preempt", preempt)
    at_least_one({"preempt.check_every": preempt.check_every})
    not_negative({"preempt.max_requeues": preempt.max_requeues})
    for sig in preempt.signals:
        if sig not in SIGNAL_NAMES:
            raise ConfigError(f"preempt.signals: {sig!r} is not one of {', '.join(SIGNAL_NAMES)}")


def check_log(log: LogConfig) -> None:
    """[log]: a log line's period."""
    check_choices("log", log)
    at_least_one({"log.every_steps": log.every_steps})


def check_across_sections(cfg: Config) -> None:
    """What Adasum and PowerSGD cannot be combined with in [run] and [optim]."""
    hc, precision = cfg.horovod, cfg.run.precision
    if hc.op == "adasum" and precision == "fp16":
        raise ConfigError("horovod.op='adasum' cannot be combined with run.precision='fp16' "
                          "(Adasum steps inside its hooks, where a GradScaler cannot act)")
    if cfg.optim.grad_clip > 0 and hc.op == "adasum":
        raise ConfigError("optim.grad_clip cannot be combined with horovod.op='adasum' (Adasum "
                          "steps inside its hooks, before any averaged gradient exists)")
    if hc.compression == "powersgd" and precision == "fp16":
        raise ConfigError("horovod.compression='powersgd' cannot be combined with "
                          "run.precision='fp16': the residuals would carry the loss scale from "
                          "step to step (use bf16)")


def check_task_section(cfg: Config) -> None:
    """The task's own section: its choices, then the task's own check."""
    section = find_task(cfg.task.name).section
    if section is None:
        return
    choices = {f"{section.key}.{k}": v for k, v in section.choices.items()}
    check_choices(section.key, getattr(cfg, section.key), choices)
    if section.check is not None:
        section.check(cfg)


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


#: Experiment trackers (hpcdp.train.tracking), each with the module its extra installs.
TRACKERS = {"mlflow": "mlflow", "wandb": "wandb"}


def _check_trackers(run: RunConfig) -> None:
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
