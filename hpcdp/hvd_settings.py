"""hpcdp's Horovod and Open MPI runtime settings, in one place.

Training, the Slurm scripts and the benchmarks take their environment from
here, so that what is benchmarked is what runs. Pure: no Horovod or MPI
imports, only environment variables, which must be in the launcher's
environment (read by Open MPI at startup and by Horovod at `hvd.init()`).

Why each value (2 ranks sharing 2 cores, measured with `hpcdp bench allreduce`
and `hpcdp bench fusion`; figures in hpcdp/bench/README.md):

- OMPI_MCA_mpi_yield_when_idle=1: the setting that decides. Open MPI
  busy-polls while it waits; with Horovod's background thread, the Python
  thread that spins (yielding) in `hvd.synchronize` and the other rank on the
  same two cores, a rank that never yields takes the core the other side
  needs. A training-step proxy (compute between 60 asynchronous gradient
  all-reduces, 11 MB) took 255-380 ms per step without yielding and
  173-217 ms with it, whatever the cycle time.
- HOROVOD_CYCLE_TIME=1 (ms, Horovod's own default, set explicitly). With
  yielding on, 1, 2, 5 and 10 ms gave the same step time within noise,
  while longer cycles cost latency: an all-reduce waits for the next cycle,
  so 200 fused 40 KiB gradients took 7-8 ms a round at 1 ms against 11 ms
  at 5 ms (fusion's gain over no fusion: 1.4-2.2x against 1.5x), and a loop of
  blocking 16 MiB all-reduces fell below raw MPI at 10 ms. Raise it (5-10)
  only where other threads of the process make many small MPI calls while
  Horovod runs (those ran 10x faster at 5 ms than at 1 ms), or where
  yielding is not possible.
- HOROVOD_FUSION_THRESHOLD: chosen at `hvd.init()` by `fusion_threshold_bytes`,
  because the right size depends on what one call costs. On CPUs through MPI
  (shared memory here): 1 MiB, the size of a core's L2 cache, so that each
  fused buffer is copied in, reduced and copied out while it is still in
  cache; 200 fused 40 KiB gradients took 4.4 ms a round at 1 MiB against
  5.1 ms at 128 MiB (8 alternating launches each, 1 MiB faster in 7 of them),
  and a tensor larger than the threshold (a gradient bucket, a big layer) is
  reduced on its own, in place, as before. On GPUs (NCCL) and through Gloo,
  where each call costs far more (Gloo: 25 ms a round at 1 MiB against 16 ms
  at 128 MiB), Horovod's own 128 MiB: one call for everything ready in a
  cycle. A value in the environment or in the config wins.
- OMP_NUM_THREADS=1: one compute thread per rank when ranks fill the cores;
  more only oversubscribe them.

Not set here: process binding. The launcher starts ranks with
`--bind-to none`, so the background and the compute threads of a rank can
run on either core; binding a rank to one core puts all of its threads on
that core.
"""

from __future__ import annotations

from collections.abc import Mapping

#: Horovod's own fusion threshold (bytes): kept on GPUs and under Gloo.
HOROVOD_FUSION_BYTES = 128 * 1024 * 1024
#: hpcdp's threshold for CPU tensors reduced through MPI: one core's L2 cache.
CPU_MPI_FUSION_BYTES = 1024 * 1024
#: Gradient bucket size hpcdp trains with on CPUs (hpcdp.grad_buckets, horovod.bucket_mb
#: < 0): 3 buckets for ResNet-18 at width 32; 1, 2, 8 and 64 MiB were no faster on 2 ranks.
#: Here, not in grad_buckets, so that the benchmarks' parent processes need no torch.
CPU_BUCKET_BYTES = 4 << 20

# What Horovod 0.28.1 and Open MPI 4.1 use when nothing is set (read from their
# sources): the baseline the benchmarks compare against.
HOROVOD_DEFAULTS: Mapping[str, str] = {
    "HOROVOD_CYCLE_TIME": "1",  # milliseconds
    "HOROVOD_FUSION_THRESHOLD": str(HOROVOD_FUSION_BYTES),  # bytes
    "OMPI_MCA_mpi_yield_when_idle": "0",
}

#: Set in every launcher's environment. HOROVOD_FUSION_THRESHOLD is not among
#: them: it depends on the device and the controller, known at `hvd.init()`.
RECOMMENDED: Mapping[str, str] = {
    "HOROVOD_CYCLE_TIME": "1",
    "OMPI_MCA_mpi_yield_when_idle": "1",
    "OMP_NUM_THREADS": "1",
}


def recommended_env(overrides: Mapping[str, object] | None = None) -> dict[str, str]:
    """hpcdp's settings for training runs, with `overrides` winning (e.g. from a config file)."""
    env = dict(RECOMMENDED)
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
