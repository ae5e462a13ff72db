"""The Horovod environment a rank starts with, in one place.

Training and the benchmarks take their Horovod variables from here, so that what
is benchmarked is what runs. No Horovod, MPI or torch imports: the rules are pure
functions of the environment, the device and the Horovod build; hpcdp.runtime.dist
applies `horovod_env` before `hvd.init()`. Threads, yielding and pinning, which
`hpcdp prep` applies without Horovod, are the thread plan's
(hpcdp.runtime.thread_plan); `recommended_env` joins the two for the launchers.

Why each value (the measurements behind them, dated, are in
docs/measured-choices.md):

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
- HOROVOD_WAKE_ON_ENQUEUE=1 on CPUs (`wake_env`): with hpcdp's Horovod patch
  an all-reduce starts when the last rank's tensors arrive, not at the next
  cycle.

The whole Horovod environment a rank starts with is decided here
(`horovod_env`); hpcdp.runtime.dist only applies it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from hpcdp.config import HorovodConfig
from hpcdp.runtime.cpus import CpuView, probe
from hpcdp.runtime.thread_plan import plan_runtime

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


def format_bytes(nbytes: int) -> str:
    """'1 MiB', '128 MiB', '512 KiB': for the settings line."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= size:
            return f"{nbytes / size:g} {unit}"
    return f"{nbytes} B"
