"""Slurm batch scripts for hpcdp training, rendered by a pure function of their options.

`render(**options)` turns an allocation request into a batch script. Its
keyword arguments ARE the options: the command line is built from its
signature, `render_options` refuses names it does not have, and every invalid
request raises `RenderError` before a line is produced, so a broken request
never becomes a broken script. The `#SBATCH` lines come in a fixed order with
every value shell-quoted, which keeps golden-file tests readable.

`slurm/train.sbatch` is `render()` with the defaults and `slurm/prep.sbatch` is
`render_prep()`, the two sharing one prologue (unit tests keep the files equal to
the renderings). The shell text is the package's templates/*.sh, which shellcheck
lints; render writes only the lines that depend on the options before it. The launch
adapts to whatever `sbatch` options the job is given: in the job, the batch shell asks
hpcdp.cluster.layout for the ranks, their spread over the nodes and their CPUs.
"""

from __future__ import annotations

import inspect
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources

from hpcdp.cluster import containers
from hpcdp.config import PreemptConfig
from hpcdp.runtime.preempt import EXIT_REQUEUE

# Signals the time-limit warning may be: USR1 or USR2 (libraries such as NCCL use
# USR1 themselves), or TERM. The one chosen goes to the ranks' preempt.signals too.
SIGNALS = ("USR1", "USR2", "TERM")
# Slurm stores the signal lead time in 16 bits.
MAX_SIGNAL_LEAD = 65535
# sbatch options render() manages itself; extra options may not repeat them.
MANAGED = (
    "job-name", "nodes", "ntasks-per-node", "gpus-per-node", "cpus-per-task", "time",
    "partition", "account", "qos", "constraint", "exclusive", "signal", "requeue",
    "open-mode", "output",
)
# srun options the training script sets itself; srun_options may not repeat them.
SRUN_MANAGED = ("mpi", "ntasks", "ntasks-per-node", "cpus-per-task", "overcommit",
                "kill-on-bad-exit")
_TIME = re.compile(
    r"^(?:(?P<d>\d+)-(?P<dh>\d+)(?::(?P<dm>\d+)(?::(?P<ds>\d+))?)?"
    r"|(?P<h>\d+):(?P<hm>\d+):(?P<hs>\d+)|(?P<m>\d+)(?::(?P<ms>\d+))?)\Z",
    re.ASCII,  # \d is 0-9 only, and \Z refuses a trailing newline that $ would let through
)
_NODE_RANGE = re.compile(r"^(\d+)-(\d+)\Z", re.ASCII)
_PLUGIN = re.compile(r"^[a-z][a-z0-9_]*\Z")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
_OVERRIDE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*=")
_OPTION = re.compile(r"^--(?P<name>[a-z][a-z0-9-]*)(?:=(?P<value>.*))?$", re.DOTALL)


class RenderError(ValueError):
    """An allocation request that cannot become a working batch script."""


def time_seconds(limit: str) -> int:
    """Seconds in a Slurm time limit: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S."""
    m = _TIME.match(limit) if isinstance(limit, str) else None
    if m is None:
        raise RenderError(
            f"time {limit!r} is not a Slurm time limit "
            "(minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS)"
        )
    g = {k: int(v) for k, v in m.groupdict().items() if v is not None}
    if "d" in g:
        return ((g["d"] * 24 + g["dh"]) * 60 + g.get("dm", 0)) * 60 + g.get("ds", 0)
    if "h" in g:
        return (g["h"] * 60 + g["hm"]) * 60 + g["hs"]
    return g["m"] * 60 + g.get("ms", 0)


def _q(value: object) -> str:
    return shlex.quote(str(value))


def _int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise RenderError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise RenderError(f"{name} must be at least {minimum}, got {value}")
    return value


def node_range(nodes: object) -> tuple[int, int]:
    """(min, max) nodes from a count or a Slurm range "MIN-MAX" (the job starts on what
    Slurm grants within it, and a requeued job may come back on another count)."""
    if isinstance(nodes, str):
        m = _NODE_RANGE.match(nodes)
        if m is None:
            raise RenderError(f"nodes must be an integer or a range MIN-MAX like 1-4, "
                              f"got {nodes!r}")
        low, high = int(m[1]), int(m[2])
        if low < 1 or high < low:
            raise RenderError(f"nodes range {nodes!r} must have 1 <= MIN <= MAX")
        return low, high
    count = _int("nodes", nodes, 1)
    return count, count


def _text(name: str, value: object) -> str:
    problem = containers.line_problem(name, value)
    if problem:
        raise RenderError(problem)
    return str(value)


def _sbatch_value(name: str, value: object) -> str:
    """A value for an #SBATCH line: one line, no backslash (sbatch reads `\\` as an
    escape even inside quotes, so the job would get another value than the one shown)."""
    text = _text(name, value)
    if "\\" in text:
        raise RenderError(f"{name} {text!r} contains a backslash, which sbatch would "
                          "read as an escape; leave it out")
    return text


def _lines(name: str, values: object) -> list[str]:
    if isinstance(values, str) or not isinstance(values, Sequence):
        raise RenderError(f"{name} must be a list of strings, got {values!r}")
    return [_text(f"{name}[{i}]", v) for i, v in enumerate(values)]


def _sbatch_option(index: int, option: str) -> str:
    """One extra `--name[=value]` option as an #SBATCH line, its value quoted."""
    text = _sbatch_value(f"sbatch_options[{index}]", option)
    m = _OPTION.match(text)
    if m is None:
        raise RenderError(
            f"sbatch_options[{index}] {option!r} is not a long sbatch option like --mem=8G"
        )
    name, value = m["name"], m["value"]
    if name in MANAGED:
        raise RenderError(
            f"sbatch_options[{index}] {option!r} repeats an option render() sets itself; "
            f"use its {name.replace('-', '_')} argument"
        )
    return f"#SBATCH --{name}" if value is None else f"#SBATCH --{name}={_q(value)}"


def _launch(srun_options: Sequence[str],
            container: Mapping[str, object] | None) -> tuple[list[str], bool]:
    """The script's srun_options and launch_prefix arrays (site options and a container),
    and whether a container runs the ranks (a launch prefix, or pyxis's image option).

    Always rendered, empty too, so that a variable of that name in the job's
    environment never reaches the srun line.
    """
    opts = _lines("srun_options", srun_options)
    for i, option in enumerate(opts):
        m = _OPTION.match(option)
        if m is None:
            raise RenderError(f"srun_options[{i}] {option!r} is not a long srun option "
                              "like --cpu-bind=cores")
        if m["name"] in SRUN_MANAGED:
            hint = "; use srun_mpi" if m["name"] == "mpi" else ""
            raise RenderError(f"srun_options[{i}] {option!r} repeats an option the script "
                              f"sets itself ({', '.join(SRUN_MANAGED)}){hint}")
    try:
        box = None if container is None else containers.from_mapping(container)
    except containers.ContainerError as e:
        raise RenderError(str(e)) from None
    prefix = box.prefix() if box else []
    opts += box.srun_options() if box else []
    contained = bool(prefix) or any(o.startswith("--container-image=") for o in opts)
    return [f"srun_options=({' '.join(map(_q, opts))})",
            f"launch_prefix=({' '.join(map(_q, prefix))})"], contained


def _template(name: str) -> str:
    """The text of templates/NAME.sh, which ships with the package (package data)."""
    return resources.files("hpcdp.cluster").joinpath(f"templates/{name}.sh").read_text()


_CARRIED = re.compile(r"@(hpcdp(?:\.\w+)+)@")
_CARRY_END = "HPCDP_LAYOUT"  # the carried program's heredoc delimiter


def _carried_source(name: str) -> str:
    """Module `name`'s source, to go into a raw triple-quoted string of the carried
    program inside the quoted heredoc that ends at the line _CARRY_END."""
    package, _, module = name.rpartition(".")
    text = resources.files(package).joinpath(f"{module}.py").read_text()
    if "'''" in text or text.endswith("\\") or _CARRY_END in text.splitlines():
        raise ValueError(f"{name}'s source cannot be carried in a raw string in triple "
                         f"single quotes inside a heredoc ending at {_CARRY_END}")
    return text


def _carried_layout() -> str:
    """templates/layout_carried.sh with each `@module@` replaced by the module's source:
    the layout for a host whose python3 has the standard library and no hpcdp."""
    return _CARRIED.sub(lambda m: _carried_source(m[1]), _template("layout_carried"))


# The batch scripts' shell text lives in templates/*.sh, where shellcheck lints it
# (`make lint`): the comments that open each script, the part both scripts share
# (environment, export to the job steps, MPI plugin), and each script's launch, whose
# layout step runs hpcdp.cluster.layout: as a module, or carried in a container job's
# script (its ranks' python is the image's, and the host's may have no hpcdp).
HEADER = _template("train_header")
PREP_HEADER = _template("prep_header")
PROLOGUE = _template("prologue")
TRAIN = _template("train").replace("__EXIT_REQUEUE__", str(EXIT_REQUEUE))
LAYOUT = _template("layout")
LAYOUT_CARRIED = _carried_layout()
PREP = _template("prep")


def render(
    *,
    nodes: int | str = 1,
    gpus_per_node: int = 0,
    ntasks_per_node: int | None = None,
    cpus_per_task: int | None = None,
    time: str = "01:00:00",
    partition: str | None = None,
    account: str | None = None,
    qos: str | None = None,
    constraint: str | None = None,
    exclusive: bool = False,
    job_name: str = "hpcdp-train",
    output: str = "%x-%j.out",
    signal: str = "USR1",
    signal_lead: int = 300,
    sbatch_options: Sequence[str] = (),
    modules: Sequence[str] = (),
    setup: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    venv: str | None = None,
    srun_mpi: str | None = None,
    srun_options: Sequence[str] = (),
    container: Mapping[str, object] | None = None,
    script: str | None = None,
    config: str | None = None,
    overrides: Sequence[str] = (),
) -> str:
    """The batch script for one training allocation.

    nodes (a count, or a range "MIN-MAX": the training then needs a global batch
    that divides over every rank count, hpcdp.cluster.node_range), gpus_per_node
    (0: CPU-only), ntasks_per_node (default: one per GPU, else 1), cpus_per_task,
    time (Slurm format), partition, account, qos, constraint, exclusive: the
    allocation. signal and signal_lead (seconds
    before the time limit) ask Slurm to warn the ranks so they can checkpoint
    and requeue; a signal the training does not catch by default is added to
    its preempt.signals. sbatch_options: further `--name=value` options. modules
    (to `module load`), setup (shell lines), env (exports), venv: the
    environment. srun_mpi: srun's --mpi plugin (default: the site's MpiDefault).
    srun_options: more srun options (binding, say). container: settings for
    hpcdp.cluster.containers (runtime, image, mounts, gpus, options) to run each rank in.
    script: a training script of the user's own (built on hpcdp.session) that the
    ranks run instead of `python -m hpcdp.train`; `overrides` are then its arguments,
    taken as they are. config and overrides (`key.sub=value`): the training run;
    arguments given to sbatch after the script are appended to them.
    """
    alloc = _allocation(nodes, gpus_per_node, ntasks_per_node, cpus_per_task, time,
                        signal, signal_lead, exclusive)
    lines = ["#!/bin/bash", HEADER.rstrip("\n")]
    lines += _sbatch_lines(alloc, job_name, output, partition=partition, account=account,
                           qos=qos, constraint=constraint)
    lines += [_sbatch_option(i, o) for i, o in enumerate(_lines("sbatch_options", sbatch_options))]
    lines.append("set -eo pipefail")
    lines += _environment(modules, setup, env, venv, srun_mpi)
    launch, contained = _launch(srun_options, container)
    lines += launch
    lines += _training_args(signal, config, overrides, script)
    train = TRAIN.replace("__LAYOUT__\n", LAYOUT_CARRIED if contained else LAYOUT)
    return "\n".join(lines) + "\n\n" + PROLOGUE + "\n" + train


@dataclass(frozen=True)
class _Allocation:
    """render()'s allocation, checked."""

    nodes: str  # "N", or "MIN-MAX"
    gpus_per_node: int
    ntasks_per_node: int | None
    cpus_per_task: int | None
    time: str
    signal: str
    signal_lead: int
    exclusive: bool


def _allocation(nodes: object, gpus_per_node: object, ntasks_per_node: object,
                cpus_per_task: object, time: str, signal: str, signal_lead: object,
                exclusive: object) -> _Allocation:
    """The allocation's values checked against each other and Slurm's limits."""
    low, high = node_range(nodes)
    nodes = str(low) if low == high else f"{low}-{high}"
    gpus_per_node = _int("gpus_per_node", gpus_per_node, 0)
    if ntasks_per_node is not None:
        ntasks_per_node = _int("ntasks_per_node", ntasks_per_node, 1)
        if gpus_per_node and ntasks_per_node != gpus_per_node:
            raise RenderError(
                f"one rank per GPU: ntasks_per_node ({ntasks_per_node}) must equal "
                f"gpus_per_node ({gpus_per_node}), or be left out"
            )
    if cpus_per_task is not None:
        cpus_per_task = _int("cpus_per_task", cpus_per_task, 1)
    limit = time_seconds(time)
    if limit <= 0:
        raise RenderError(f"time {time!r} is zero; give the job a positive time limit")
    if signal not in SIGNALS:
        raise RenderError(f"signal {signal!r} is not one of {', '.join(SIGNALS)}")
    signal_lead = _int("signal_lead", signal_lead, 1)
    if signal_lead > MAX_SIGNAL_LEAD:
        raise RenderError(f"signal_lead {signal_lead}s exceeds Slurm's {MAX_SIGNAL_LEAD}s")
    if signal_lead >= limit:
        raise RenderError(
            f"signal_lead ({signal_lead}s) must be shorter than the time limit {time!r} ({limit}s)"
        )
    if not isinstance(exclusive, bool):
        raise RenderError(f"exclusive must be true or false, got {exclusive!r}")
    return _Allocation(nodes, gpus_per_node, ntasks_per_node, cpus_per_task, time, signal,
                       signal_lead, exclusive)


def _sbatch_lines(alloc: _Allocation, job_name: str, output: str,
                  **optional: str | None) -> list[str]:
    """The #SBATCH lines for the allocation; `optional`: partition, account, qos,
    constraint, each left out when None."""
    sb = [
        f"--job-name={_q(_sbatch_value('job_name', job_name))}",
        f"--nodes={alloc.nodes}",
    ]
    # Left out by default, so that `sbatch --ntasks=N` or `--gpus-per-node=G` decide.
    per_node = alloc.ntasks_per_node or alloc.gpus_per_node
    # On a node range, --ntasks-per-node=1 makes Slurm count MIN tasks, one per node, so
    # the job never gets more than MIN nodes; one rank per node is its default anyway.
    if per_node and not ("-" in alloc.nodes and per_node == 1):
        sb.append(f"--ntasks-per-node={per_node}")
    if alloc.gpus_per_node:
        sb.append(f"--gpus-per-node={alloc.gpus_per_node}")
    if alloc.cpus_per_task is not None:
        sb.append(f"--cpus-per-task={alloc.cpus_per_task}")
    if alloc.exclusive:
        sb.append("--exclusive")
    sb.append(f"--time={_q(alloc.time)}")
    for name, value in optional.items():
        if value is not None:
            sb.append(f"--{name}={_q(_sbatch_value(name, value))}")
    sb += [
        f"--signal={alloc.signal}@{alloc.signal_lead}",
        "--requeue",
        "--open-mode=append",
        f"--output={_q(_sbatch_value('output', output))}",
    ]
    return [f"#SBATCH {o}" for o in sb]


def _environment(modules: Sequence[str], setup: Sequence[str], env: Mapping[str, str] | None,
                 venv: str | None, srun_mpi: str | None) -> list[str]:
    """Shell lines that load modules, run the setup lines, export `env`, and name the
    venv and srun's MPI plugin for the launch that follows."""
    body = [f"module load {_q(m)}" for m in _lines("modules", modules)]
    body += _lines("setup", setup)
    if env is not None:
        if not isinstance(env, Mapping):
            raise RenderError(f"env must be a mapping of names to values, got {env!r}")
        for name, value in env.items():
            if not isinstance(name, str) or not _ENV_NAME.match(name):
                raise RenderError(f"env name {name!r} is not a valid shell variable name")
            body.append(f"export {name}={_q(_text(f'env[{name}]', value))}")
    if venv is not None:
        body.append(f"export HPCDP_VENV={_q(_text('venv', venv))}")
    if srun_mpi is not None:
        if not isinstance(srun_mpi, str) or not _PLUGIN.match(srun_mpi):
            raise RenderError(f"srun_mpi {srun_mpi!r} is not an MPI plugin name like pmix "
                              "(see `srun --mpi=list`)")
        body.append(f"export HPCDP_SRUN_MPI={srun_mpi}")
    return body


def _training_args(signal: str, config: str | None, overrides: Sequence[str],
                   script: str | None = None) -> list[str]:
    """The shell arrays of the launch: what the ranks run (`hpcdp.train`, or `script`),
    the warning signal where the training does not catch it by default, then the
    config and overrides (a script's own arguments, unchecked)."""
    body = []
    if signal not in PreemptConfig().signals:
        # After the sbatch arguments, so that none of them is taken for an option value.
        body.append(_q(f'preempt.signals=["{signal}","TERM"]').join(("signal_args=(", ")")))
    args: list[str] = []
    if config is not None:
        args += ["--config", _text("config", config)]
    for i, item in enumerate(_lines("overrides", overrides)):
        if script is None and not _OVERRIDE.match(item):
            raise RenderError(f"overrides[{i}] {item!r} is not of the form key.sub=value")
        args.append(item)
    body.append("train_args=(" + " ".join(_q(a) for a in args) + ")")
    return [f"entry=({' '.join(map(_q, _entry(script)))})", *body]


def _entry(script: object) -> list[str]:
    """What python runs on every rank: the trainer's module, or the user's script."""
    if script is None:
        return ["-m", "hpcdp.train"]
    text = _text("script", script)
    if not text or text.startswith("-"):
        raise RenderError(f"script {text!r} is not a file name (a Python file such as "
                          "my_train.py)")
    return [text]


def render_prep() -> str:
    """slurm/prep.sbatch: the dataset preparation job, with the training's prologue."""
    sb = ["--job-name=hpcdp-prep", "--nodes=1", "--time=00:30:00", "--signal=B:USR1@120",
          "--requeue", "--open-mode=append", "--output=%x-%j.out"]
    lines = ["#!/bin/bash", PREP_HEADER.rstrip("\n"), *(f"#SBATCH {o}" for o in sb),
             "set -eo pipefail"]
    return "\n".join(lines) + "\n\n" + PROLOGUE + "\n" + PREP


def option_names() -> list[str]:
    """The options render() accepts, in signature order."""
    return list(inspect.signature(render).parameters)


def render_options(options: Mapping[str, object]) -> str:
    """render(**options), refusing unknown option names with the list of valid ones."""
    unknown = sorted(set(options) - set(option_names()))
    if unknown:
        raise RenderError(
            f"unknown option(s) {', '.join(unknown)}; valid: {', '.join(option_names())}"
        )
    return render(**options)  # type: ignore[arg-type]
