"""The thread and yield plan of one rank: compute threads, Open MPI's yielding, and the
CPUs a rank is pinned to, from the CPUs it may use (hpcdp.runtime.cpus) and what its
launcher says. Training applies it before `hvd.init()` (hpcdp.runtime.dist.init) and
`hpcdp prep` before MPI starts, which is why it lives apart from the Horovod environment
(hpcdp.runtime.hvd_settings): preparation needs it without Horovod. No Horovod, MPI or
torch imports: pure functions of the environment, and `apply`, which writes the plan
into this process's environment, where Open MPI reads it at MPI_Init.

Why each value (the measurements behind them, dated, are in
docs/measured-choices.md):

- OMPI_MCA_mpi_yield_when_idle=1: the setting that decides. Open MPI
  busy-polls while it waits; with Horovod's background thread, the Python
  thread that spins (yielding) in `hvd.synchronize` and the other rank on the
  same cores, a rank that never yields takes the core the other side needs.
- Compute threads and yielding: chosen per process by `plan_runtime` from the
  CPUs the rank may use (see its docstring), so that a plain `horovodrun`,
  `mpirun` or `srun` gets them without exports. On 2 ranks sharing 2 cores that
  is one thread per rank and yielding on: more threads only oversubscribe the cores.
- A rank whose launcher left the node's ranks sharing one mask is pinned to its
  share of it (`cpu_share`, applied by hpcdp.runtime.dist.init).

Otherwise process binding is the launcher's choice. hpcdp.runtime.launcher (tests,
benchmarks) and horovodrun start ranks with `--bind-to none`, and CPU training
then pins each rank to its share; a plain `mpirun -np 2` binds each rank to
one core, and the rule then counts that core.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field

from hpcdp.runtime.cpus import CpuView, format_cpu_list, probe
from hpcdp.runtime.env_counts import positive_int, slurm_tasks_per_node

YIELD_VAR = "OMPI_MCA_mpi_yield_when_idle"
#: Threads per rank that wait in MPI while a step communicates: the Python thread
#: (in `hvd.synchronize`) and Horovod's background thread. Compute threads sleep then.
BUSY_THREADS_PER_RANK = 2
#: Where launchers say how many ranks run on this node: Open MPI's mpirun (also under
#: horovodrun), horovodrun --gloo, MPICH/Intel MPI's hydra. Slurm's srun: below.
LOCAL_SIZE_VARS = ("OMPI_COMM_WORLD_LOCAL_SIZE", "HOROVOD_LOCAL_SIZE", "MPI_LOCALNRANKS")


def local_ranks(environ: Mapping[str, str]) -> int:
    """How many ranks the launcher started on this node (1 when no launcher says).

    Slurm's counts are read only inside a job step (srun): a batch script's own
    shell runs one process whatever --ntasks-per-node says.
    """
    for var in LOCAL_SIZE_VARS:
        value = positive_int(environ.get(var))
        if value:
            return value
    per_node = environ.get("SLURM_STEP_TASKS_PER_NODE", "")
    if per_node:
        counts = slurm_tasks_per_node(per_node)
        node = positive_int(str(int(environ.get("SLURM_NODEID", "0") or 0) + 1)) or 1
        # A step on part of the job's nodes: the largest count is the safe guess.
        return counts[node - 1] if node <= len(counts) else max(counts)
    if "SLURM_STEP_ID" in environ:
        return positive_int(environ.get("SLURM_NTASKS_PER_NODE")) or 1
    return 1


def bound_alone(view: CpuView, ranks: int, environ: Mapping[str, str]) -> bool:
    """Whether this rank's mask is its own (the launcher bound each rank to its CPUs)
    rather than shared with the node's other ranks (pure).

    Only a mask narrower than the cpuset can be a binding. Where the launcher
    says, it decides: Open MPI 4's mpirun sets `OMPI_MCA_orte_bound_at_launch=1`
    when it binds, srun sets `SLURM_CPU_BIND_TYPE` (`none` or a kind), and
    horovodrun --gloo never binds. Otherwise (srun's default binding, other MPIs,
    taskset around a whole job) the masks count as the ranks' own when that many
    disjoint masks fit in the cpuset: a binding is far more common than a job
    narrowed as a whole, and a shared mask taken as one's own only happens when
    it is at most 1/ranks of the cpuset.
    """
    if not view.narrowed:
        return False
    if environ.get("OMPI_MCA_orte_bound_at_launch", "") == "1":
        return True
    if "HOROVOD_LOCAL_SIZE" in environ and "OMPI_COMM_WORLD_LOCAL_SIZE" not in environ:
        return False
    kind = environ.get("SLURM_CPU_BIND_TYPE", "").strip().lower()
    if kind:
        return not kind.startswith("none")
    return len(view.affinity) * ranks <= len(view.pool)


@dataclass(frozen=True)
class RuntimePlan:
    """Threads and yielding for one rank, why, and what to put into its environment."""

    threads: int
    threads_why: str
    yield_idle: bool
    yield_why: str
    cpus: float  # the CPUs the ranks that share them may use (a quota can make it fractional)
    sharers: int  # the local ranks sharing those CPUs (1 when the launcher bound this rank)
    local_ranks: int
    env: Mapping[str, str] = field(default_factory=dict)
    pinned: frozenset[int] = frozenset()  # the CPUs hpcdp pinned this rank to (cpu_share)

    @property
    def oversubscribed(self) -> bool:
        """Whether the compute threads of the ranks sharing these CPUs outnumber them."""
        return self.threads * self.sharers > self.cpus

    def describe(self) -> str:
        """'threads 1 (2 CPUs / 2 local ranks), yield on (4 busy threads > 2 CPUs)'."""
        state = "on" if self.yield_idle else "off"
        pinned = f", pinned to CPU {format_cpu_list(self.pinned)}" if self.pinned else ""
        return (f"threads {self.threads} ({self.threads_why}), yield {state} "
                f"({self.yield_why}){pinned}")


def _cpus(n: float) -> str:
    return f"{n:g} CPU" + ("" if n == 1 else "s")


def _threads_reason(view: CpuView, bound: bool, sharers: int, ranks: int, cpus: float) -> str:
    if cpus < len(view.affinity) and view.quota is not None:  # the quota, not the mask, limits
        quota = f"cgroup quota {_cpus(view.quota)}"
        return f"{quota} / {ranks} local ranks" if ranks > 1 else quota
    if sharers > 1:
        return f"{_cpus(cpus)} / {sharers} local ranks"
    return f"{_cpus(cpus)} bound to this rank" if bound else _cpus(cpus)


def yielding(environ: Mapping[str, str]) -> bool:
    """Whether Open MPI will yield when idle, as `environ` tells it (unset: no)."""
    return environ.get(YIELD_VAR, "0").strip().lower() not in ("0", "", "false", "no")


def _exported_threads(environ: Mapping[str, str]) -> int | None:
    """OMP_NUM_THREADS as the user exported it (its first level when nested: '4,2')."""
    text = environ.get("OMP_NUM_THREADS")
    if text is None:
        return None
    value = positive_int(text.split(",")[0])
    if value is None:
        raise ValueError(f"OMP_NUM_THREADS={text!r} is not a positive whole number")
    return value


def plan_runtime(view: CpuView, ranks: int, environ: Mapping[str, str]) -> RuntimePlan:
    """Compute threads and MPI yielding for one of `ranks` local ranks (pure).

    The CPUs a rank may use are its affinity mask, within its cgroup's CPU quota.
    Where the launcher bound each rank to CPUs of its own (mpirun's core binding,
    srun --cpu-bind: `bound_alone`), the rank gets all of its mask; otherwise the
    node's ranks share the mask equally. The quota is shared
    by all local ranks (a container's or a Slurm step's cgroup holds them all).
    Threads: those CPUs over the ranks sharing them, at least 1; many cores per
    rank (one rank per GPU) keep many threads. Yielding: on when the ranks' busy
    waiting threads (BUSY_THREADS_PER_RANK each) outnumber the CPUs they share.
    An exported OMP_NUM_THREADS or OMPI_MCA_mpi_yield_when_idle wins.
    """
    ranks = max(1, ranks)
    bound = bound_alone(view, ranks, environ)
    sharers = 1 if bound else ranks
    cpus = float(len(view.affinity) or 1)
    if view.quota is not None:
        cpus = min(cpus, view.quota * sharers / ranks)
    env: dict[str, str] = {}
    threads = _exported_threads(environ)
    if threads is not None:
        why = "OMP_NUM_THREADS exported"
    else:
        threads = max(1, math.floor(cpus / sharers + 1e-9))
        why = _threads_reason(view, bound, sharers, ranks, cpus)
        env["OMP_NUM_THREADS"] = str(threads)
    if "MKL_NUM_THREADS" not in environ:
        env["MKL_NUM_THREADS"] = str(threads)
    busy = BUSY_THREADS_PER_RANK * sharers
    if YIELD_VAR in environ:
        yield_idle = yielding(environ)
        yield_why = f"{YIELD_VAR} exported"
    else:
        yield_idle = busy > cpus
        yield_why = f"{busy} busy threads {'>' if yield_idle else '<='} {_cpus(cpus)}"
        if yield_idle:
            env[YIELD_VAR] = "1"
    return RuntimePlan(threads, why, yield_idle, yield_why, cpus, sharers, ranks, env)


#: Where launchers give a rank its index among the node's ranks (the order of LOCAL_SIZE_VARS,
#: then srun's).
LOCAL_RANK_VARS = ("OMPI_COMM_WORLD_LOCAL_RANK", "HOROVOD_LOCAL_RANK", "MPI_LOCALRANKID",
                   "SLURM_LOCALID")


def local_rank(environ: Mapping[str, str]) -> int | None:
    """This rank's index among the node's ranks, as the launcher says (None: not said)."""
    for var in LOCAL_RANK_VARS:
        text = environ.get(var, "").strip()
        if text.isdigit():
            return int(text)
    return None


def cpu_share(view: CpuView, ranks: int, rank: int | None,
              environ: Mapping[str, str], threads: int = 1) -> frozenset[int] | None:
    """The CPUs to pin local rank `rank` of `ranks` to, or None to leave its mask (pure).

    Where a launcher leaves the node's ranks sharing one mask (horovodrun passes
    `-bind-to none`; horovodrun --gloo never binds), the kernel moves each rank's
    compute thread and its Horovod thread between the cores, and a rank waiting
    for the all-reduce shares a core with one that computes. Each rank gets a
    contiguous share of the mask instead, as mpirun's default binding would give
    it (the measurement: docs/measured-choices.md). Left alone: one rank,
    a rank the launcher bound (`bound_alone`), `srun --cpu-bind=none` (asked for),
    an unknown local rank, fewer CPUs than ranks, and a share smaller than the
    rank's compute `threads` (an exported OMP_NUM_THREADS): OpenMP threads stacked
    on fewer cores wait for each other at every barrier, many times slower.
    """
    if ranks < 2 or rank is None or not 0 <= rank < ranks:
        return None
    if environ.get("SLURM_CPU_BIND_TYPE", "").strip().lower().startswith("none"):
        return None
    if bound_alone(view, ranks, environ):
        return None
    cpus = sorted(view.affinity)
    per = len(cpus) // ranks
    if per < max(threads, 1):
        return None
    return frozenset(cpus[rank * per:(rank + 1) * per])


def pin_process(cpus: frozenset[int]) -> bool:
    """Set every thread of this process to `cpus` (threads started later inherit the
    mask of the thread that starts them). False where the kernel refuses."""
    if not hasattr(os, "sched_setaffinity"):
        return False
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tids = [0]
    try:
        for tid in tids:
            os.sched_setaffinity(tid, cpus)
    except OSError:
        return False
    return True


def apply(environ: MutableMapping[str, str] | None = None,
          view: CpuView | None = None, ranks: int | None = None) -> RuntimePlan:
    """Plan this process's threads and yielding and set them in `environ` (os.environ).

    Call before MPI starts (`hvd.init()`, `from mpi4py import MPI`): Open MPI reads
    OMPI_MCA_* once, at MPI_Init. OMP_NUM_THREADS reaches libraries loaded later and
    child processes; a process that has imported torch also calls torch.set_num_threads
    (hpcdp.runtime.dist.init does). Raises ValueError for a malformed OMP_NUM_THREADS.
    """
    environ = os.environ if environ is None else environ
    count = local_ranks(environ) if ranks is None else ranks
    plan = plan_runtime(view or probe(), count, environ)
    environ.update(plan.env)
    return plan


def rethread(plan: RuntimePlan, ranks: int, environ: Mapping[str, str],
             view: CpuView | None = None) -> RuntimePlan:
    """`plan` with the threads for `ranks` local ranks, its yielding kept (MPI has started).

    For a count learnt only at `hvd.init()`. The threads `plan` set itself are
    replaced; exported ones stay.
    """
    own = {k for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS") if k in plan.env}
    if "OMP_NUM_THREADS" not in own:
        return plan
    fresh = plan_runtime(view or probe(), ranks,
                         {k: v for k, v in environ.items() if k not in own})
    return dataclasses.replace(
        plan, threads=fresh.threads, threads_why=fresh.threads_why, cpus=fresh.cpus,
        sharers=fresh.sharers, local_ranks=max(1, ranks),
        env={**plan.env, **{k: fresh.env[k] for k in own}})
