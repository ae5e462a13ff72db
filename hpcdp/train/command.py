"""`hpcdp train` / `python -m hpcdp.train`: parse and check the config, then run.

The same command runs alone, under mpirun, horovodrun (MPI or Gloo) or
`srun --mpi=pmix`. Everything here happens before any collective, so a bad
config, model name or fault spec fails alike on every rank.
"""

from __future__ import annotations

import argparse
import os
import sys

from hpcdp import config as cfgmod
from hpcdp import tasks
from hpcdp.cluster import sweep
from hpcdp.config import Config, ConfigError
from hpcdp.runtime import faults, watchdog
from hpcdp.runtime.crash import report_crashes


def parse_args(argv: list[str] | None) -> tuple[Config, bool]:
    """--config FILE, --print-config, then `section.key=value` overrides."""
    p = argparse.ArgumentParser(
        prog="hpcdp train",
        description="Train a model data-parallel with Horovod. Overrides like optim.lr=0.05 "
        "take precedence over the config file, which takes precedence over the task's "
        "defaults, then hpcdp's.",
    )
    p.add_argument("--config", "-c", help="TOML config file (e.g. hpcdp/configs/digits.toml)")
    p.add_argument("--print-config", action="store_true", help="print the effective config, exit")
    p.add_argument("overrides", nargs="*", metavar="section.key=value")
    args = p.parse_args(argv)
    # An array task of a sweep (HPCDP_SWEEP): its own override set and run folder, last.
    overrides = [*args.overrides, *sweep.task_overrides(os.environ)]
    return cfgmod.build(args.config, overrides, tasks.defaults), args.print_config


def main(argv: list[str] | None = None) -> int:
    report_crashes()  # also under `python -m hpcdp.train`, which bypasses the `hpcdp` command
    try:
        cfg, print_only = parse_args(argv)
        task = tasks.get(cfg.task.name)
        task.check_model(cfg.model.name)
        faults.armed()  # a malformed HPCDP_FAULT fails here, on every rank alike
    except (ConfigError, faults.FaultError) as e:
        print(f"hpcdp train: error: {e}", file=sys.stderr, flush=True)
        return 2
    if print_only:
        print(cfgmod.dumps(cfg))
        return 0
    try:  # a user's builder, before Horovod: it fails alike on every rank, exit 2
        from hpcdp.train.model_check import check_user_builder

        check_user_builder(cfg, task)
    except ConfigError as e:
        print(f"hpcdp train: error: {e}", file=sys.stderr, flush=True)
        return 2
    # Imported only now: torch and Horovod take seconds to import, and a bad config or
    # --print-config must answer before that.
    from hpcdp.runtime import dist
    from hpcdp.train.loop import train

    try:
        code = train(cfg, task)
    except dist.AgreedError as e:
        print(f"hpcdp train: error: {e}", file=sys.stderr, flush=True)
        code = 2
    watchdog.stop()
    dist.shutdown_and_exit(code)
    return code  # not reached when Horovod ran
