"""`hpcdp slurm submit` for more than one plain job: sweeps, prep-then-train, segments.

- A sweep (`--array FILE` or `--grid key=v1,v2`): one array task per override set,
  every set checked against the config schema first (hpcdp.cluster.sweep), `%A_%a` logs
  in the sweep folder, `--throttle P` for `--array=0-N%P`.
- A chain: `--prep "ARGS"` submits slurm/prep.sbatch's job first and the training
  with `--dependency=afterok:<its id>`; `--after ID` waits for a job submitted
  before. The ids come from `sbatch --parsable`.
- Segments, for sites that disable requeue: `--segments N` submits the job N times
  under one job name with `--dependency=singleton` and `--no-requeue`, so each
  segment starts when the one before has ended and resumes from its checkpoint.

Everything is checked before the first sbatch; a job already submitted when a later
one fails is named, so nothing is left running unknown.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hpcdp import config as cfgmod
from hpcdp import tasks
from hpcdp.cluster import jobstatus, sweep
from hpcdp.cluster import render as slurm
from hpcdp.cluster import submit as sbatch
from hpcdp.cluster.render import RenderError
from hpcdp.config import ConfigError

DEFAULT_OUTPUT = "%x-%j.out"
_JOB = re.compile(r"^\d+(?:_\d+)?\Z", re.ASCII)


def add_submit_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sweeps and chains (docs/slurm-sweeps.md)")
    g.add_argument("--array", metavar="SWEEP", help="a TOML or CSV file of override sets: "
                   "one array task each")
    g.add_argument("--grid", action="append", metavar="KEY=V1,V2",
                   help="sweep every combination of these values (repeatable)")
    g.add_argument("--sweep-dir", metavar="DIR", help="the sweep's folder: sweep.json, logs "
                   "and one run folder per task (needed with --array/--grid)")
    g.add_argument("--throttle", type=int, metavar="P", help="run at most P array tasks at once")
    g.add_argument("--prep", metavar="ARGS", help="first submit the preparation job with "
                   "these arguments (as after slurm/prep.sbatch); train after it succeeds")
    g.add_argument("--prep-ntasks", type=int, default=1, metavar="N",
                   help="ranks of the preparation job (default: 1)")
    g.add_argument("--prep-time", default="00:30:00", help="its time limit (default: 00:30:00)")
    g.add_argument("--after", action="append", metavar="JOB",
                   help="start only after this job completed successfully (repeatable)")
    g.add_argument("--segments", type=int, metavar="N", help="submit N chained segments "
                   "(--dependency=singleton, --no-requeue) for sites that disable requeue")


def add_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("status", help="a job's state, restarts, elapsed time, max RSS and "
                       "exit code per step (sacct)", allow_abbrev=False)
    p.add_argument("job", help="job id, or array task as ARRAYID_TASK")
    p = sub.add_parser("collect", help="gather a sweep's summary.json files into one table "
                       "(and a plot)", allow_abbrev=False)
    p.add_argument("sweep_dir", metavar="DIR", help="the folder given as --sweep-dir")
    p.add_argument("--format", choices=("markdown", "csv"), default="markdown")
    p.add_argument("--out", help="write the table here instead of stdout")
    p.add_argument("--plot", metavar="PNG", help="plot --metric against --x into this file")
    p.add_argument("--metric", default="val_loss", help="the summary.json number to plot "
                   "(default: val_loss)")
    p.add_argument("--x", help="the swept key on the x axis (default: the first)")


def wanted(ns: argparse.Namespace) -> bool:
    """Whether a submission needs more than one plain sbatch."""
    return any(getattr(ns, name, None) for name in
               ("array", "grid", "prep", "after", "segments", "throttle", "sweep_dir"))


# ---- planning (no side effects) --------------------------------------------------------


def _job_ids(ids: Sequence[str] | None) -> list[str]:
    for job in ids or ():
        if not _JOB.match(job):
            raise RenderError(f"--after {job!r} is not a job id like 1234")
    return list(ids or ())


def dependency(after_ok: Sequence[str], singleton: bool) -> list[str]:
    """The --dependency option: every condition must hold (joined by commas)."""
    parts = [f"afterok:{':'.join(after_ok)}"] if after_ok else []
    if singleton:
        parts.append("singleton")
    return [f"--dependency={','.join(parts)}"] if parts else []


def array_option(count: int, throttle: int | None) -> str:
    if throttle is not None and throttle < 1:
        raise RenderError(f"--throttle must be at least 1, got {throttle}")
    return f"--array=0-{count - 1}" + (f"%{throttle}" if throttle else "")


def build_config(path: str | None, overrides: Sequence[str],
                 environ: Mapping[str, str]) -> Any:
    """config.build with the tasks' defaults, as `hpcdp train` builds it."""
    return cfgmod.build(path, list(overrides), tasks.defaults, environ=environ)


def _config_and_overrides(options: Mapping[str, object]) -> tuple[str | None, list[str]]:
    config = options.get("config")
    overrides = options.get("overrides") or ()
    return (config if isinstance(config, str) else None,
            [str(o) for o in overrides])  # type: ignore[attr-defined]


def check_training(options: Mapping[str, object]) -> None:
    """The training's config, built before a chain submits anything (its data may not
    exist yet: missing paths are fine; the job's variables stand in)."""
    config, overrides = _config_and_overrides(options)
    try:
        build_config(config, overrides, {**os.environ, **dict.fromkeys(sweep.JOB_VARS, "0")})
    except ConfigError as e:
        raise RenderError(f"the training's config: {e}") from None


def plan_sweep(ns: argparse.Namespace,
               options: dict[str, object]) -> tuple[Path, dict[str, Any], list[str]]:
    """Check the sweep; set its env and log path. (sweep folder, sweep.json, sbatch args)"""
    if not ns.sweep_dir:
        raise RenderError("--sweep-dir is needed with --array/--grid: the folder for "
                          "sweep.json, the logs and one run folder per task")
    sweep_dir = Path(ns.sweep_dir).resolve()
    sets, source = sweep.read_sets(ns.array, ns.grid or [])
    config, overrides = _config_and_overrides(options)
    sweep.check(sets, source, config, overrides, sweep_dir, build_config)
    env = dict(options.get("env") or {})  # type: ignore[call-overload]
    if sweep.ENV in env:
        raise RenderError(f"--env {sweep.ENV}=... is set by the sweep itself")
    env[sweep.ENV] = str(sweep_dir / sweep.SWEEP_FILE)
    options["env"] = env
    output = options.get("output", DEFAULT_OUTPUT)
    if output == DEFAULT_OUTPUT:
        options["output"] = f"{sweep_dir}/%x-%A_%a.out"
    elif "%a" not in str(output):
        raise RenderError(f"--output {output!r}: array tasks would share one log; "
                          "include %a (the task) and %A (the array)")
    record = sweep.record(sets, source, sweep_dir)
    return sweep_dir, record, [array_option(len(sets), ns.throttle)]


def prep_script(args: str) -> str:
    """slurm/prep.sbatch with its arguments set inside (sbatch reads a script on stdin)."""
    words = shlex.split(args)
    if not words:
        raise RenderError("--prep needs the preparation's arguments, e.g. "
                          "'digits --out data/digits'")
    script = slurm.render_prep()
    marker = "set -eo pipefail\n"
    assert marker in script
    return script.replace(marker, f"{marker}set -- {shlex.join(words)}\n", 1)


def prep_args(ns: argparse.Namespace, options: Mapping[str, object]) -> list[str]:
    """sbatch options of the preparation job: its size and time, the training's account."""
    if ns.prep_ntasks < 1:
        raise RenderError(f"--prep-ntasks must be at least 1, got {ns.prep_ntasks}")
    slurm.time_seconds(ns.prep_time)
    args = [f"--ntasks={ns.prep_ntasks}", f"--time={ns.prep_time}"]
    for name in ("partition", "account", "qos"):
        if options.get(name):
            args.append(f"--{name}={options[name]}")
    return args


def _check_sbatch_options(options: Mapping[str, object], ns: argparse.Namespace) -> None:
    """--sbatch-options may not set what this submission sets itself."""
    owned = {"array": ns.array or ns.grid,
             "dependency": ns.prep or ns.after or ns.segments,
             "no-requeue": ns.segments}
    for option in options.get("sbatch_options") or ():  # type: ignore[attr-defined]
        name = str(option).lstrip("-").split("=", 1)[0]
        if owned.get(name):
            raise RenderError(f"--sbatch-options={option}: this submission sets --{name} "
                              "itself (see --array/--grid, --prep, --after, --segments)")


# ---- submitting ------------------------------------------------------------------------


def run_submit(ns: argparse.Namespace, options: dict[str, object]) -> int:
    """Check everything, then submit: prep, then the training (its segments)."""
    try:
        if ns.save is not None:
            sbatch.check_target("--save", ns.save, ns.overwrite)
        after = _job_ids(ns.after)
        if ns.segments is not None:
            if ns.segments < 1:
                raise RenderError(f"--segments must be at least 1, got {ns.segments}")
            if options.get("job_name") == "hpcdp-train":
                raise RenderError("--segments: give the chain its own --job-name; singleton "
                                  "waits for every job of yours with the same name")
        _check_sbatch_options(options, ns)
        sweep_dir, record, array = None, None, []
        if ns.array or ns.grid:
            sweep_dir, record, array = plan_sweep(ns, options)
        elif ns.throttle is not None or ns.sweep_dir:
            raise RenderError("--throttle and --sweep-dir go with a sweep (--array or --grid)")
        else:
            check_training(options)
        prep = (prep_script(ns.prep), prep_args(ns, options)) if ns.prep else None
        script = slurm.render_options(options)
        if sweep_dir is not None and record is not None:
            sweep.save(sweep_dir, record)
        if ns.save is not None:
            sbatch.write_script(ns.save, script)
    except (RenderError, sweep.SweepError) as e:
        print(f"hpcdp slurm submit: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"hpcdp slurm submit: {e.filename or ''}: {e.strerror or e}", file=sys.stderr)
        return 2
    submitted: list[str] = []
    try:
        if prep is not None:
            prep_id = sbatch.submit(prep[0], args=prep[1])
            submitted.append(f"prep {prep_id}")
            print(f"hpcdp slurm submit: preparation job {prep_id}", file=sys.stderr)
            after.append(prep_id)
        segments = ns.segments or 1
        for _ in range(segments):
            extra = ["--no-requeue"] if ns.segments else []
            job = sbatch.submit(script, args=[*dependency(after, bool(ns.segments)), *array,
                                             *extra])
            submitted.append(job)
            print(job)
    except RuntimeError as e:
        done = f"; already submitted: {', '.join(submitted)}" if submitted else ""
        print(f"hpcdp slurm submit: {e}{done}", file=sys.stderr)
        return 1
    return 0


def run_status(ns: argparse.Namespace) -> int:
    try:
        sys.stdout.write(jobstatus.status(ns.job))
    except ValueError as e:
        print(f"hpcdp slurm status: {e}", file=sys.stderr)
        return 2
    except jobstatus.StatusError as e:
        print(f"hpcdp slurm status: {e}", file=sys.stderr)
        return 1
    return 0


def run_collect(ns: argparse.Namespace) -> int:
    try:
        columns, rows = sweep.collect(ns.sweep_dir)
        keys = columns[1:columns.index("state")]
        text = sweep.table(columns, rows, ns.format)
        if ns.out:
            sbatch.write_script(ns.out, text)
        else:
            sys.stdout.write(text)
        if ns.plot:
            x = ns.x or (keys[0] if keys else None)
            if x not in keys:
                raise sweep.SweepError(f"--x {x!r} is not a swept key; swept: {', '.join(keys)}")
            if ns.metric not in columns:
                raise sweep.SweepError(f"--metric {ns.metric!r} is in no task's summary.json "
                                       "yet; found: " + ", ".join(columns[len(keys) + 2:]))
            try:
                drawn = sweep.plot(rows, x, ns.metric, keys, ns.plot)
            except ImportError:
                print("hpcdp slurm collect: matplotlib is not installed here: no plot "
                      "(pip install matplotlib)", file=sys.stderr)
                return 1
            print(f"hpcdp slurm collect: {ns.metric} against {x}, {drawn} point(s): "
                  f"{ns.plot}", file=sys.stderr)
    except sweep.SweepError as e:
        print(f"hpcdp slurm collect: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"hpcdp slurm collect: {e.filename or ''}: {e.strerror or e}", file=sys.stderr)
        return 2
    return 0
