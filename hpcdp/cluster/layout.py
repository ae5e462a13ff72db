"""A training job's task layout, worked out in the job from what Slurm granted.

The batch script (templates/train.sh) cannot know its allocation when it is rendered:
`sbatch --nodes=2 --gpus-per-node=4 ...` and a node range decide it at submission, and
a requeued job may come back on other nodes. So the script runs

    python -m hpcdp.cluster.layout

in the batch shell before it starts srun. `plan(environ)` reads Slurm's variables (pure)
and decides how many ranks srun starts, how they spread over the nodes and how many
CPUs each gets; `main` prints that for the script to read, or says what is wrong and
exits 2 before any srun:

- With GPUs per task (--gpus-per-task, --ntasks-per-gpu): the job's tasks; Slurm
  gives each its GPU(s).
- Other GPU jobs: one rank per GPU of each node, which needs the same GPU count on
  every node.
- Without GPUs: the job's tasks.

CPUs per rank: --cpus-per-task if given, else the fewest that any node can give each
of its ranks (Slurm's per-node counts). srun needs the number: Slurm >= 22.05 reads
SRUN_CPUS_PER_TASK and no longer passes sbatch's --cpus-per-task on. Where a node
has fewer CPUs than its ranks need, srun gets --overcommit and a warning says so.

Imports no torch, Horovod, h5py or MPI: it runs in the batch shell, before any rank.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hpcdp.runtime.env_counts import slurm_tasks_per_node

#: Exit status for a layout that cannot run (the batch script's status for bad input).
EXIT_BAD_LAYOUT = 2


class LayoutError(ValueError):
    """An allocation that one rank per GPU (or per task) cannot be laid out on."""


@dataclass(frozen=True)
class Layout:
    """What srun starts: `ntasks` ranks over `nodes` nodes, `cpus_per_task` CPUs each."""

    nodes: int
    gpus: int  # per node, as the batch node sees it (0: CPU-only)
    ntasks: int
    tasks_per_node: int | None  # given to srun only for one rank per GPU
    cpus_per_task: int
    warning: str | None = None  # ranks share CPUs: srun gets --overcommit

    @property
    def overcommit(self) -> bool:
        """Whether ranks share CPUs on some node (srun must be told, or it refuses)."""
        return self.warning is not None

    def srun_options(self) -> list[str]:
        """srun's layout options, in the order the batch script passes them."""
        opts = [f"--ntasks={self.ntasks}"]
        if self.tasks_per_node is not None:
            opts.append(f"--ntasks-per-node={self.tasks_per_node}")
        opts.append(f"--cpus-per-task={self.cpus_per_task}")
        return opts + (["--overcommit"] if self.overcommit else [])


def _value(environ: Mapping[str, str], var: str) -> str:
    """`var`'s value, '' when unset: the script reads an empty variable as unset."""
    return environ.get(var, "").strip()


def _whole(var: str, text: str) -> int:
    if not text.isdigit():
        raise LayoutError(f"{var}={text!r} is not a whole number")
    return int(text)


def _count(environ: Mapping[str, str], var: str, default: int) -> int:
    """`var` as a whole number, `default` when unset or empty."""
    text = _value(environ, var)
    return _whole(var, text) if text else default


def _per_node(var: str, text: str) -> list[int]:
    """One of Slurm's per-node lists ('2(x3),1' -> [2, 2, 2, 1])."""
    try:
        return slurm_tasks_per_node(text)
    except ValueError:
        raise LayoutError(f"{var}={text!r} is not one of Slurm's per-node lists "
                          "like 2(x3),1") from None


def gpus_per_node(environ: Mapping[str, str]) -> int:
    """GPUs on the batch node: SLURM_GPUS_ON_NODE (Slurm >= 20.11), else --gpus-per-node's
    value ('4' or 'a100:4'), else none."""
    text = _value(environ, "SLURM_GPUS_ON_NODE")
    if text:
        return _whole("SLURM_GPUS_ON_NODE", text)
    given = _value(environ, "SLURM_GPUS_PER_NODE")
    count = given.rsplit(":", 1)[-1]
    if count and not count.isdigit():
        raise LayoutError(f"SLURM_GPUS_PER_NODE={given!r} is not a GPU count like 4 or a100:4")
    return int(count) if count else 0


def _one_rank_per_gpu(environ: Mapping[str, str], nodes: int, gpus: int) -> None:
    """Refuse what one rank per GPU cannot run on (the messages name the sbatch options)."""
    per_node = _value(environ, "SLURM_NTASKS_PER_NODE")
    if per_node and per_node != str(gpus):
        raise LayoutError(f"one rank per GPU, but --ntasks-per-node={per_node} differs "
                          f"from the {gpus} GPUs per node")
    total = _value(environ, "SLURM_GPUS")
    if nodes > 1 and total and not _value(environ, "SLURM_GPUS_PER_NODE"):
        raise LayoutError(f"--gpus={total} over {nodes} nodes may give the nodes different "
                          "GPU counts, and one rank per GPU needs the same count on each: "
                          "ask for --gpus-per-node, or --gpus-per-task with --ntasks")


def tasks(environ: Mapping[str, str], nodes: int,
          gpus: int) -> tuple[int, list[int], int | None]:
    """(ranks, ranks on each node, the --ntasks-per-node srun is given or None)."""
    if _value(environ, "SLURM_GPUS_PER_TASK") or _value(environ, "SLURM_NTASKS_PER_GPU"):
        ntasks = _count(environ, "SLURM_NTASKS", nodes)
    elif gpus > 0:
        _one_rank_per_gpu(environ, nodes, gpus)
        return nodes * gpus, [gpus] * nodes, gpus
    else:
        ntasks = _count(environ, "SLURM_NTASKS",
                        nodes * _count(environ, "SLURM_NTASKS_PER_NODE", 1))
    listed = _value(environ, "SLURM_TASKS_PER_NODE") or str(ntasks)
    return ntasks, _per_node("SLURM_TASKS_PER_NODE", listed), None


def _on_node(cpus_on: Sequence[int], node: int) -> int:
    """Node `node`'s CPUs; a list shorter than the nodes repeats its first count."""
    return cpus_on[node] if node < len(cpus_on) else cpus_on[0]


def cpus_per_task(environ: Mapping[str, str], tasks_on: Sequence[int],
                  cpus_on: Sequence[int]) -> int:
    """--cpus-per-task if given, else the fewest CPUs any node can give each of its ranks
    (at least 1)."""
    given = _value(environ, "SLURM_CPUS_PER_TASK")
    if given:
        return _whole("SLURM_CPUS_PER_TASK", given)
    shares = [_on_node(cpus_on, i) // max(n, 1) for i, n in enumerate(tasks_on)]
    return max(min(shares, default=1), 1)


def crowding(tasks_on: Sequence[int], cpus_on: Sequence[int], per_task: int) -> str | None:
    """The warning for the first node whose CPUs its ranks would share, or None."""
    for node, ranks in enumerate(tasks_on):
        cpus = _on_node(cpus_on, node)
        if cpus < ranks * per_task:
            return (f"{cpus} CPUs on node {node} for {ranks} ranks, so ranks share CPUs; "
                    "ask for --cpus-per-gpu, --cpus-per-task or --exclusive")
    return None


def plan(environ: Mapping[str, str]) -> Layout:
    """The job's layout from Slurm's variables in `environ` (pure); LayoutError when one
    rank per GPU cannot be laid out or a variable cannot be read."""
    nodes = _count(environ, "SLURM_JOB_NUM_NODES", 1)
    gpus = gpus_per_node(environ)
    ntasks, tasks_on, tasks_per_node = tasks(environ, nodes, gpus)
    cpus_text = (_value(environ, "SLURM_JOB_CPUS_PER_NODE")
                 or _value(environ, "SLURM_CPUS_ON_NODE") or "1")
    cpus_on = _per_node("SLURM_JOB_CPUS_PER_NODE", cpus_text)
    per_task = cpus_per_task(environ, tasks_on, cpus_on)
    return Layout(nodes, gpus, ntasks, tasks_per_node, per_task,
                  crowding(tasks_on, cpus_on, per_task))


def log_line(text: str) -> str:
    """`text` as the batch script's `log` writes it: '[hpcdp.sbatch HH:MM:SS] text' (UTC)."""
    return f"[hpcdp.sbatch {time.strftime('%H:%M:%S', time.gmtime())}] {text}"


def shell_lines(layout: Layout) -> str:
    """What the batch script reads: 'NTASKS NODES GPUS CPUS_PER_TASK OVERCOMMIT' (0 or 1),
    then srun's layout options on a line of their own (none holds a space)."""
    head = (f"{layout.ntasks} {layout.nodes} {layout.gpus} {layout.cpus_per_task} "
            f"{int(layout.overcommit)}")
    return f"{head}\n{' '.join(layout.srun_options())}\n"


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    """Print the layout for the batch script (stdout), its warning as the script's log
    would (stderr); or the error, and EXIT_BAD_LAYOUT."""
    parser = argparse.ArgumentParser(
        prog="python -m hpcdp.cluster.layout",
        description="The training job's task layout from Slurm's variables, for the "
                    "batch script: ranks, nodes, GPUs per node, CPUs per rank, srun's options.")
    parser.parse_args(argv)
    try:
        layout = plan(os.environ if environ is None else environ)
    except LayoutError as e:
        print(log_line(f"error: {e}"), file=sys.stderr, flush=True)
        return EXIT_BAD_LAYOUT
    if layout.warning:
        print(log_line(f"warning: {layout.warning}"), file=sys.stderr, flush=True)
    sys.stdout.write(shell_lines(layout))
    return 0


if __name__ == "__main__":
    sys.exit(main())
