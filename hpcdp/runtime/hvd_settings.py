"""hpcdp's Horovod and Open MPI runtime settings, in one place.

Training, `hpcdp prep`, the Slurm scripts and the benchmarks take their
environment from here, so that what is benchmarked is what runs. No Horovod,
MPI or torch imports: the rules are pure functions of the environment and of
the CPUs a process may use (hpcdp.runtime.cpus); `apply` writes their result into this
process's environment, where Open MPI reads it at MPI_Init and Horovod at
`hvd.init()`, so it must run before either.

Why each value (the measurements behind them, dated, are in
docs/measured-choices.md):

- OMPI_MCA_mpi_yield_when_idle=1: the setting that decides. Open MPI
  busy-polls while it waits; with Horovod's background thread, the Python
  thread that spins (yielding) in `hvd.synchronize` and the other rank on the
  same cores, a rank that never yields takes the core the other side needs.
- HOROVOD_CYCLE_TIME (`cycle_env`): 50 ms where Horovod wakes on enqueue
  (below), else Horovod's 1 ms. Without the wake an all-reduce waits for the
  next cycle, so a long cycle costs latency. With it, the cycle only paces the
  negotiations Horovod's thread makes while nothing is queued, each a
  collective with the other ranks on the cores training computes on (through
  Gloo a TCP round trip), so fewer of them leave those cores to training.
- HOROVOD_FUSION_THRESHOLD: chosen at `hvd.init()` by `fusion_threshold_bytes`,
  because the right size depends on what one call costs. On CPUs through MPI
  (shared memory): 1 MiB, the size of a core's L2 cache, so that each fused
  buffer is copied in, reduced and copied out while it is still in cache; a
  tensor larger than the threshold (a gradient bucket, a big layer) is reduced
  on its own, in place. On GPUs (NCCL) and through Gloo, where each call costs
  far more, Horovod's own 128 MiB: one call for everything ready in a cycle.
  A value in the environment or in the config wins.
- Compute threads and yielding: chosen per process by `plan_runtime` from the
  CPUs the rank may use (see its docstring), so that a plain `horovodrun`,
  `mpirun` or `srun` gets them without exports. Training applies them before
  `hvd.init()` (hpcdp.runtime.dist.init); `hpcdp prep` before MPI starts. On 2 ranks
  sharing 2 cores that is one thread per rank and yielding on: more threads only
  oversubscribe the cores.
- HOROVOD_WAKE_ON_ENQUEUE=1 on CPUs (`wake_env`): with hpcdp's Horovod patch
  an all-reduce starts when the last rank's tensors arrive, not at the next
  cycle. And a rank whose launcher left the node's ranks sharing one mask is
  pinned to its share of it (`cpu_share`, applied by hpcdp.runtime.dist.init).

The whole Horovod environment a rank starts with is decided here
(`horovod_env`); hpcdp.runtime.dist only applies it.

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
from pathlib import Path

from hpcdp.config import HorovodConfig
from hpcdp.runtime.cpus import CpuView, format_cpu_list, probe

#: Horovod's own fusion threshold (bytes): kept on GPUs and under Gloo.
HOROVOD_FUSION_BYTES = 128 * 1024 * 1024
#: hpcdp's threshold for CPU tensors reduced through MPI: one core's L2 cache.
CPU_MPI_FUSION_BYTES = 1024 * 1024
#: Gradient bucket size hpcdp trains with on CPUs (hpcdp.runtime.grad_buckets, horovod.bucket_mb
#: < 0): large enough for the gradients of most models that train on CPUs to go in one
#: all-reduce after backward. A CPU rank's reduction runs on the cores its backward uses,
#: so reducing early buckets during backward overlaps nothing and takes those cores from
#: it, while every extra bucket costs a negotiation (docs/measured-choices.md).
#: Here, not in grad_buckets, so that the benchmarks' parent processes need no torch.
CPU_BUCKET_BYTES = 64 << 20

# What Horovod 0.28.1 and Open MPI 4.1 use when nothing is set (read from their
# sources): the baseline the benchmarks compare against.
HOROVOD_DEFAULTS: Mapping[str, str] = {
    "HOROVOD_CYCLE_TIME": "1",  # milliseconds
    "HOROVOD_FUSION_THRESHOLD": str(HOROVOD_FUSION_BYTES),  # bytes
    "OMPI_MCA_mpi_yield_when_idle": "0",
}

YIELD_VAR = "OMPI_MCA_mpi_yield_when_idle"
#: Threads per rank that wait in MPI while a step communicates: the Python thread
#: (in `hvd.synchronize`) and Horovod's background thread. Compute threads sleep then.
BUSY_THREADS_PER_RANK = 2
#: Where launchers say how many ranks run on this node: Open MPI's mpirun (also under
#: horovodrun), horovodrun --gloo, MPICH/Intel MPI's hydra. Slurm's srun: below.
LOCAL_SIZE_VARS = ("OMPI_COMM_WORLD_LOCAL_SIZE", "HOROVOD_LOCAL_SIZE", "MPI_LOCALNRANKS")


def recommended_env(overrides: Mapping[str, object] | None = None, ranks: int = 2,
                    view: CpuView | None = None) -> dict[str, str]:
    """hpcdp's settings for `ranks` ranks started from here on this process's CPUs
    (unbound), with `overrides` winning (e.g. from a config file): threads, yielding, and
    the switches of the build's Gloo patches.
    The fusion threshold and the cycle time depend on the device, the controller and
    the Horovod build: each rank chooses them at `hvd.init()` (`horovod_env`)."""
    plan = plan_runtime(view or probe(), ranks, {})
    env = dict(plan.env)
    env.update(gloo_env({}, horovod_patches()))
    if overrides:
        env.update({k: str(v) for k, v in overrides.items()})
    return env


def default_env() -> dict[str, str]:
    """Horovod's and Open MPI's own defaults, set explicitly so a stray variable cannot leak in."""
    return dict(HOROVOD_DEFAULTS)


def cpu_operations(environ: Mapping[str, str]) -> str:
    """'gloo' or 'mpi': what Horovod will reduce CPU tensors with, read as Horovod reads it.

    HOROVOD_CPU_OPERATIONS decides; else the controller (horovodrun --gloo sets
    both); else MPI.
    """
    ops = environ.get("HOROVOD_CPU_OPERATIONS", "").strip().lower()
    if ops:
        return ops
    return "gloo" if environ.get("HOROVOD_CONTROLLER", "").strip().lower() == "gloo" else "mpi"


def fusion_threshold_bytes(on_gpu: bool, cpu_ops: str) -> int:
    """hpcdp's HOROVOD_FUSION_THRESHOLD for this device and CPU backend (see the module doc)."""
    if on_gpu or cpu_ops != "mpi":
        return HOROVOD_FUSION_BYTES
    return CPU_MPI_FUSION_BYTES


def fusion_env(environ: Mapping[str, str], on_gpu: bool) -> dict[str, str]:
    """HOROVOD_FUSION_THRESHOLD to set before `hvd.init()`, unless the environment has one."""
    if "HOROVOD_FUSION_THRESHOLD" in environ:
        return {}
    threshold = fusion_threshold_bytes(on_gpu, cpu_operations(environ))
    return {"HOROVOD_FUSION_THRESHOLD": str(threshold)}


WAKE_VAR = "HOROVOD_WAKE_ON_ENQUEUE"


def wake_env(environ: Mapping[str, str], on_gpu: bool) -> dict[str, str]:
    """HOROVOD_WAKE_ON_ENQUEUE=1 for CPU training, unless the environment sets it.

    Horovod's background thread sleeps out its cycle time between negotiations, so
    a step's last all-reduce waits for the next cycle: half a cycle on average,
    on every rank, every step. With hpcdp's Horovod patch
    (scripts/horovod-wake-on-enqueue.patch) an enqueue wakes the thread at once,
    and a rank with tensors waiting stays in the negotiation, so the all-reduce
    starts when the last rank's gradients arrive. On CPUs, where a step is a few
    milliseconds for small models, that wait is a large part of the step (see
    docs/benchmarks.md). Left off on GPUs, where it is not measured here and where
    Horovod's per-tensor requests rely on a cycle to fuse. A Horovod built without
    the patch ignores the variable.
    """
    if on_gpu or WAKE_VAR in environ:
        return {}
    return {WAKE_VAR: "1"}


def switched_on(environ: Mapping[str, str], var: str) -> bool:
    """Whether `environ` switches a patch on (the library reads a number > 0 as yes)."""
    try:
        return int(environ.get(var, "0").strip() or "0") > 0
    except ValueError:
        return False


def wake_requested(environ: Mapping[str, str]) -> bool:
    """Whether `environ` asks Horovod to wake on enqueue."""
    return switched_on(environ, WAKE_VAR)


#: What each of hpcdp's Horovod patches (scripts/*.patch) leaves in the library. The
#: Gloo marks end in "-2" for the builds where the patch is behind its switch and the
#: pair all-reduce reduces in rank order (an older build's marks are not read as these).
PATCH_MARKS: Mapping[str, bytes] = {
    "wake-on-enqueue": WAKE_VAR.encode(),
    "gloo-yield-when-busy": b"hpcdp-gloo-yield-when-busy-2",
    "gloo-pair-allreduce": b"hpcdp-gloo-pair-allreduce-2",
}
GLOO_YIELD_VAR = "HOROVOD_GLOO_YIELD_WHEN_BUSY"
GLOO_PAIR_VAR = "HOROVOD_GLOO_PAIR_ALLREDUCE"
#: The variable that switches each patch on: the patched library behaves as stock
#: Horovod (on the wire too) unless it is set to a number > 0.
PATCH_SWITCHES: Mapping[str, str] = {
    "wake-on-enqueue": WAKE_VAR,
    "gloo-yield-when-busy": GLOO_YIELD_VAR,
    "gloo-pair-allreduce": GLOO_PAIR_VAR,
}
GLOO_PATCHES = ("gloo-yield-when-busy", "gloo-pair-allreduce")
_patches: dict[str, frozenset[str]] = {}


def horovod_patches(library: str | None = None) -> frozenset[str]:
    """The names in PATCH_MARKS of hpcdp's patches the installed Horovod was built with
    (their marks are in its library). Read once per library: a file search, no import."""
    if library is None:
        import importlib.util

        spec = importlib.util.find_spec("horovod.torch.mpi_lib_v2")
        library = spec.origin if spec is not None and spec.origin else ""
    if library not in _patches:
        try:
            import mmap

            with open(library, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
                _patches[library] = frozenset(
                    name for name, mark in PATCH_MARKS.items() if m.find(mark) >= 0)
        except (OSError, ValueError):
            _patches[library] = frozenset()
    return _patches[library]


def horovod_wakes(library: str | None = None) -> bool:
    """Whether the installed Horovod has hpcdp's wake-on-enqueue patch."""
    return "wake-on-enqueue" in horovod_patches(library)


def gloo_env(environ: Mapping[str, str], patches: frozenset[str]) -> dict[str, str]:
    """The switches of the Gloo patches the build has (`patches`), on, unless `environ`
    sets them: Gloo yields when busy, and two ranks all-reduce small buffers in one
    exchange (scripts/*.patch, docs/benchmarks.md). On GPUs too, where Gloo can be
    the controller. Every rank of a job must agree on the pair all-reduce
    (hpcdp.runtime.build_guard checks it before Horovod starts)."""
    return {PATCH_SWITCHES[p]: "1" for p in GLOO_PATCHES
            if p in patches and PATCH_SWITCHES[p] not in environ}


def active_patches(environ: Mapping[str, str], patches: frozenset[str]) -> frozenset[str]:
    """Which of the build's `patches` `environ` switches on."""
    return frozenset(p for p in patches if switched_on(environ, PATCH_SWITCHES[p]))


#: Horovod's cycle where an enqueue wakes its thread (see the module doc).
WOKEN_CYCLE_MS = 50


def cycle_env(environ: Mapping[str, str], patched: bool) -> dict[str, str]:
    """HOROVOD_CYCLE_TIME to set before `hvd.init()`: WOKEN_CYCLE_MS where `environ`
    asks for the wake and the installed Horovod has it (`patched`), unless the
    environment sets a cycle; else nothing (Horovod's 1 ms)."""
    if "HOROVOD_CYCLE_TIME" in environ or not (patched and wake_requested(environ)):
        return {}
    return {"HOROVOD_CYCLE_TIME": str(WOKEN_CYCLE_MS)}


def horovod_env(hc: HorovodConfig, run_dir: Path, on_gpu: bool = False,
                environ: Mapping[str, str] | None = None,
                patched: bool = False, patches: frozenset[str] = frozenset()) -> dict[str, str]:
    """Every HOROVOD_* variable hpcdp sets before `hvd.init()` (pure; dist.init applies it).

    The fusion threshold: the config's, else one already in `environ`, else
    hpcdp's for the device and CPU backend (`fusion_threshold_bytes`). The wake on
    enqueue: `wake_env`. The cycle time: the config's, else one in `environ`, else
    hpcdp's for whether the Horovod build (`patched`) wakes on enqueue (`cycle_env`).
    The switches of the Gloo patches the build has (`patches`, `gloo_env`), unless set
    in `environ`. Stall checks and the timeline (relative to `run_dir`): the config's, when set.
    """
    env: dict[str, str] = {}
    if hc.fusion_threshold_mb >= 0:
        env["HOROVOD_FUSION_THRESHOLD"] = str(int(hc.fusion_threshold_mb * 1024 * 1024))
    else:
        env.update(fusion_env(environ or {}, on_gpu))
    env.update(wake_env(environ or {}, on_gpu))
    env.update(cycle_env({**(environ or {}), **env}, patched))
    env.update(gloo_env(environ or {}, patches))
    if hc.cycle_time_ms >= 0:
        env["HOROVOD_CYCLE_TIME"] = f"{hc.cycle_time_ms:g}"
    if hc.stall_check_s >= 0:
        env["HOROVOD_STALL_CHECK_TIME_SECONDS"] = f"{hc.stall_check_s:g}"
    if hc.stall_shutdown_s >= 0:
        env["HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"] = f"{hc.stall_shutdown_s:g}"
    if hc.timeline:
        path = Path(hc.timeline)
        env["HOROVOD_TIMELINE"] = str(path if path.is_absolute() else run_dir / path)
    return env


def wake_text(environ: Mapping[str, str], patched: bool) -> str:
    """For the identity line: 'wake on enqueue', or why the cycle is slept out."""
    cycle = f"cycle {environ.get('HOROVOD_CYCLE_TIME', HOROVOD_DEFAULTS['HOROVOD_CYCLE_TIME'])} ms"
    if not wake_requested(environ):
        return f"{cycle} slept out"
    if not patched:
        return f"{cycle} slept out (Horovod without hpcdp's patch)"
    return f"wake on enqueue, {cycle}"


# --------------------------------------------------------------------------- threads, yielding


def _positive_int(text: str | None) -> int | None:
    try:
        value = int(str(text).strip())
    except ValueError:
        return None
    return value if value > 0 else None


def slurm_tasks_per_node(text: str) -> list[int]:
    """Slurm's tasks-per-node list ('2(x3),1' -> [2, 2, 2, 1])."""
    counts: list[int] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        count, _, repeat = part.partition("(x")
        n, times = _positive_int(count), _positive_int(repeat.rstrip(")") or "1")
        if n is None or times is None:
            raise ValueError(f"cannot read Slurm's tasks per node {text!r}")
        counts += [n] * times
    return counts


def local_ranks(environ: Mapping[str, str]) -> int:
    """How many ranks the launcher started on this node (1 when no launcher says).

    Slurm's counts are read only inside a job step (srun): a batch script's own
    shell runs one process whatever --ntasks-per-node says.
    """
    for var in LOCAL_SIZE_VARS:
        value = _positive_int(environ.get(var))
        if value:
            return value
    per_node = environ.get("SLURM_STEP_TASKS_PER_NODE", "")
    if per_node:
        counts = slurm_tasks_per_node(per_node)
        node = _positive_int(str(int(environ.get("SLURM_NODEID", "0") or 0) + 1)) or 1
        # A step on part of the job's nodes: the largest count is the safe guess.
        return counts[node - 1] if node <= len(counts) else max(counts)
    if "SLURM_STEP_ID" in environ:
        return _positive_int(environ.get("SLURM_NTASKS_PER_NODE")) or 1
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
    value = _positive_int(text.split(",")[0])
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


def format_bytes(nbytes: int) -> str:
    """'1 MiB', '128 MiB', '512 KiB': for the settings line."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= size:
            return f"{nbytes / size:g} {unit}"
    return f"{nbytes} B"
