"""Slurm batch scripts for hpcdp training: render (pure), submit (calls sbatch).

`hpcdp slurm`: render or submit a batch script; sweeps, chains, job status. The
options of `render` and `submit` are built from `render()`'s signature, so the
command line and the Python API cannot drift apart.
"""

from __future__ import annotations

import argparse
import inspect
import sys
import types
import typing
from collections.abc import Mapping, Sequence

from hpcdp.cliargs import parse_args
from hpcdp.cluster import chain, containers, node_range, sites
from hpcdp.cluster.render import SIGNALS, RenderError, option_names, render, render_options
from hpcdp.cluster.submit import check_target, submit, write_script

# One line of --help per render() option.
HELP = {
    "nodes": "number of nodes, or a range MIN-MAX (then data.global_batch_size must be set "
             "and divide over every rank count: docs/planning.md)",
    "gpus_per_node": "GPUs per node, one rank each (0: CPU-only)",
    "ntasks_per_node": "ranks per node (CPU-only; with GPUs it must equal --gpus-per-node)",
    "cpus_per_task": "CPUs (and threads) per rank",
    "time": "time limit: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS",
    "partition": "partition", "account": "account to charge", "qos": "quality of service",
    "constraint": "node features, e.g. a100",
    "exclusive": "whole nodes",
    "job_name": "job name (%x in --output)",
    "output": "log file, appended across requeues",
    "signal": f"signal sent to the ranks before the time limit: {', '.join(SIGNALS)}",
    "signal_lead": "seconds before the time limit to send it",
    "sbatch_options": "another sbatch option, e.g. --sbatch-options=--mem=0",
    "modules": "module to load",
    "setup": "shell line run before training (e.g. export X=1)",
    "env": "variable to export",
    "venv": "virtual environment to activate",
    "srun_mpi": "srun --mpi plugin (default: the site's MpiDefault; see srun --mpi=list)",
    "srun_options": "another srun option, e.g. --srun-options=--cpu-bind=cores",
    "script": "a training script of your own (built on hpcdp.session) to run instead of "
              "hpcdp.train; what follows -- is its arguments",
    "config": "training config file (TOML)",
}


def _add_option(parser: argparse.ArgumentParser, name: str, param: inspect.Parameter,
                hint: object) -> None:
    """One command-line option for one render() parameter, typed by its annotation."""
    flag = "--" + name.replace("_", "-")
    default = param.default
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    members = set(typing.get_args(hint)) if union else {hint}
    origins = {typing.get_origin(m) for m in members}
    help_ = HELP.get(name, name).replace("%", "%%")  # argparse %-formats help strings
    shown = f"{help_} (default: {str(default).replace('%', '%%')})"
    if name == "nodes":  # a count or a range: "2" is the count 2, "1-4" stays text
        parser.add_argument(flag, type=lambda v: int(v) if v.isdigit() else v, default=default,
                            help=shown)
    elif name == "overrides":
        parser.add_argument("overrides", nargs="*", metavar="key.sub=value",
                            help="training config overrides")
    elif hint is bool:
        parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=default,
                            help=help_)
    elif Mapping in origins:
        parser.add_argument(flag, action="append", metavar="NAME=VALUE", default=None,
                            help=f"{help_} (repeatable)")
    elif Sequence in origins:
        parser.add_argument(flag, action="append", default=None, help=f"{help_} (repeatable)")
    elif int in members:
        parser.add_argument(flag, type=int, default=default, help=shown)
    else:
        parser.add_argument(flag, type=str, default=default, help=shown)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hpcdp slurm", description=__doc__.split("\n\n")[0],
                                     allow_abbrev=False)
    sub = parser.add_subparsers(dest="action", required=True)
    hints = typing.get_type_hints(render)
    for action, help_ in (("render", "print the batch script"),
                          ("submit", "render it and submit it with sbatch; print the job id")):
        # No abbreviations: an unknown option must fail, not match a longer one.
        p = sub.add_parser(action, help=help_, allow_abbrev=False)
        for name, param in inspect.signature(render).parameters.items():
            if name == "container":
                containers.add_arguments(p)
            else:
                _add_option(p, name, param, hints[name])
        p.add_argument("--site", help="site profile: a name (python -m hpcdp.cluster.sites lists "
                                      "them), a .toml file, or none (default: HPCDP_SITE, "
                                      "else the profile that claims this cluster)")
        if action == "render":
            p.add_argument("--out", help="write the script here instead of stdout (an "
                                         "existing file only with --overwrite)")
        else:
            p.add_argument("--save", help="also write the submitted script here (an "
                                          "existing file only with --overwrite)")
            chain.add_submit_options(p)
        p.add_argument("--overwrite", action="store_true",
                       help="replace the file --out/--save names if it exists")
    chain.add_parsers(sub)  # status, collect
    return parser



def _options(ns: argparse.Namespace) -> dict[str, object]:
    opts: dict[str, object] = {}
    for name in option_names():
        value = containers.from_args(ns) if name == "container" else getattr(ns, name)
        if name == "env" and value is not None:
            pairs: dict[str, str] = {}
            for item in value:
                key, sep, val = item.partition("=")
                if not sep:
                    raise RenderError(f"--env {item!r} is not NAME=VALUE")
                pairs[key] = val
            value = pairs
        elif isinstance(value, list):
            value = tuple(value)
        if value is None and name in ("sbatch_options", "modules", "setup", "srun_options"):
            continue
        opts[name] = value
    return opts


def main(argv: list[str] | None = None) -> int:
    ns = parse_args(_parser(), sys.argv[1:] if argv is None else argv)
    if ns.action == "status":
        return chain.run_status(ns)
    if ns.action == "collect":
        return chain.run_collect(ns)
    if ns.action == "submit" and chain.wanted(ns):
        try:
            options = _options(ns)
            node_range.check(options)
        except RenderError as e:
            print(f"hpcdp slurm submit: {e}", file=sys.stderr)
            return 2
        return chain.run_submit(ns, options)
    flag, target = ("--out", ns.out) if ns.action == "render" else ("--save", ns.save)
    try:
        if target is not None:
            check_target(flag, target, ns.overwrite)
        options = _options(ns)
        node_range.check(options)
        script = render_options(sites.apply(ns.site, options))
        if target is not None:
            write_script(target, script)
    except (RenderError, sites.SiteError) as e:
        print(f"hpcdp slurm {ns.action}: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"hpcdp slurm {ns.action}: {flag} {target}: {e.strerror or e}", file=sys.stderr)
        return 2
    if ns.action == "render":
        if target is None:
            sys.stdout.write(script)
        return 0
    try:
        print(submit(script))
    except RuntimeError as e:
        print(f"hpcdp slurm submit: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
