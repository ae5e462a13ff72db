"""`hpcdp bench train --mode ceiling`: the README's plain launch commands against the ceiling.

The ceiling is the same model, data and per-rank batch run as W independent
1-rank trainings at once: no communication at all, each with the threads hpcdp's
rule gives W ranks sharing these CPUs, and bound to its share of them as a rank
would be (mpirun binds; hpcdp pins horovodrun's ranks), so that no launcher
beats the ceiling by binding where the ceiling floats. Each launcher (horovodrun
with MPI, horovodrun --gloo, mpirun) then starts W ranks exactly as a user would type it,
with none of hpcdp's settings exported, so whatever the training applies itself
is what is measured. Reported: each launcher's samples/s over the ceiling's.
Rounds rotate the order of the configurations; medians over rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from hpcdp.bench import TARGET_VS_CEILING, common
from hpcdp.bench.processes import run_together
from hpcdp.runtime import hvd_settings, thread_plan
from hpcdp.runtime.cpus import CpuView, probe
from hpcdp.runtime.launcher import LAUNCHERS, SETTINGS_VARS, run_ranks

CEILING = "ceiling"


# --------------------------------------------------------------------------- pure


def round_order(configs: Sequence[str], rnd: int) -> list[str]:
    """The configurations of round `rnd`, rotated so that each takes every position."""
    k = rnd % len(configs)
    return list(configs[k:]) + list(configs[:k])


def summarize(runs: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per model: the ceiling's median samples/s, each launcher's, and their ratios.

    Beside the ratio of the medians, each round's own ratio (a launcher against the
    ceiling of the same round): the spread that the medians hide.
    """
    out: dict[str, dict[str, Any]] = {}
    for model in dict.fromkeys(r["model"] for r in runs):
        mine = [r for r in runs if r["model"] == model]
        ceiling = {r["round"]: r["samples_per_s"] for r in mine if r["config"] == CEILING}
        if not ceiling:
            raise ValueError(f"{model}: no ceiling run")
        top = common.median(ceiling.values())
        launchers: dict[str, dict[str, Any]] = {}
        for name in dict.fromkeys(r["config"] for r in mine if r["config"] != CEILING):
            rates = [r for r in mine if r["config"] == name]
            rate = common.median(r["samples_per_s"] for r in rates)
            launchers[name] = {
                "samples_per_s": rate, "vs_ceiling": rate / top,
                "vs_ceiling_per_round": [r["samples_per_s"] / ceiling[r["round"]]
                                         for r in rates if r["round"] in ceiling],
                "settings": rates[-1].get("settings"),
            }
        out[model] = {"ceiling_samples_per_s": top, "launchers": launchers}
    return out


def checks(summary: Mapping[str, Mapping[str, Any]]) -> dict[str, bool]:
    """Each launcher against the target of its model (for the models that have one)."""
    found = {}
    for model, s in summary.items():
        target = TARGET_VS_CEILING.get(model)
        for name, launcher in s["launchers"].items():
            if target is not None:
                found[f"{model} {name} >= {target:.2f}x ceiling"] = launcher["vs_ceiling"] >= target
    return found


def table(summary: Mapping[str, Mapping[str, Any]]) -> str:
    rows = []
    for model, s in summary.items():
        rows.append([model, CEILING, s["ceiling_samples_per_s"], "1.00", ""])
        for name, launcher in s["launchers"].items():
            rounds = ", ".join(f"{v:.2f}" for v in launcher["vs_ceiling_per_round"])
            rows.append([model, name, launcher["samples_per_s"],
                         f"{launcher['vs_ceiling']:.2f}", rounds])
    return common.format_table(["model", "run", "samples/s", "x ceiling", "per round"], rows)


# --------------------------------------------------------------------------- runs


def ceiling_env(np: int, base: Mapping[str, str]) -> dict[str, str]:
    """Each process's environment: none of the caller's settings, then the threads
    hpcdp's rule gives `np` ranks sharing these CPUs (alone, a process would take them all)."""
    env = {k: v for k, v in base.items() if k not in SETTINGS_VARS}
    env.update(hvd_settings.recommended_env(ranks=np))
    env.setdefault("HDF5_USE_FILE_LOCKING", "FALSE")
    return env


def ceiling_cpus(np: int, view: CpuView) -> list[frozenset[int] | None]:
    """Each independent process's CPUs: the share hpcdp's rule pins local rank i of `np`
    to within this process's mask (pure; None where the rule leaves the mask)."""
    threads = thread_plan.plan_runtime(view, np, {}).threads
    return [thread_plan.cpu_share(view, np, i, {}, threads) for i in range(np)]


def run_config(config: str, argv_for: Callable[[Path], list[str]], run_dir: Path,
               args: argparse.Namespace, base_env: Mapping[str, str]) -> tuple[list[Path], str]:
    """Run one configuration; the run folders whose metrics count, and a settings line."""
    if config == CEILING:
        dirs = [run_dir / f"alone{i}" for i in range(args.np)]
        env = ceiling_env(args.np, {**os.environ, **base_env})
        done = run_together([argv_for(d) for d in dirs], [env] * len(dirs), args.timeout,
                            cpus=ceiling_cpus(args.np, probe()))
        if not done.ok:
            raise common.BenchError(
                f"the ceiling ({args.np} processes) failed:\n{done.output[-6000:]}")
        return dirs, _settings(done.output)
    run = run_ranks(argv_for(run_dir), np=args.np, launcher=config, timeout=args.timeout,
                    env=dict(base_env), plain=True)
    if not run.ok:
        raise common.BenchError(f"{config} (plain) failed:\n{run.describe()[-6000:]}")
    return [run_dir], _settings(run.output)


def _settings(output: str) -> str | None:
    """Rank 0's settings line from the identity lines of the output (None before hpcdp
    printed one)."""
    for match in re.findall(r"hpcdp-rank (\{[^{}]*\})", output):
        ident = json.loads(match)
        if ident.get("rank") == 0:
            return ident.get("settings")
    return None


def launchers_arg(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in LAUNCHERS]
    if bad or not names:
        raise ValueError(f"--launchers: unknown {bad}; choose from {', '.join(LAUNCHERS)}")
    return names


def report(runs: list[dict[str, Any]], args: argparse.Namespace) -> tuple[dict[str, Any], bool]:
    """Print the table and the verdicts; the JSON summary and whether every target was met."""
    summary = summarize(runs)
    verdict = checks(summary)
    print(f"\nplain launch commands (nothing exported) vs the ceiling ({args.np} independent "
          f"1-rank runs at once), batch {args.batch or 'the model default'}/rank, "
          f"{args.steps} steps after {args.warmup} warm-up, median of {args.rounds} round(s)")
    print(table(summary))
    for model, s in summary.items():
        for name, launcher in s["launchers"].items():
            if launcher["settings"]:
                print(f"  {model} {name}: {launcher['settings']}")
    for name, ok in verdict.items():
        print(f"  {'met ' if ok else 'MISSED'}  {name}")
    sys.stdout.flush()
    return {**summary, "checks": verdict}, all(verdict.values())
