"""hpcdp's Horovod and Open MPI runtime settings, in one place.

Training, the Slurm scripts and the benchmarks take their environment from
here, so that what is benchmarked is what runs. Pure: no Horovod or MPI
imports, only environment variables, which must be in the launcher's
environment (read by Open MPI at startup and by Horovod at `hvd.init()`).

Why each value (2 ranks sharing 2 cores, measured with `hpcdp bench allreduce`
and `hpcdp bench fusion`; figures in hpcdp/bench/README.md):

- HOROVOD_CYCLE_TIME=5 (ms; Horovod's default is 1). Horovod's background
  thread wakes every cycle and runs a small all-reduce to agree on which
  tensors are ready, even when idle; at 1 ms that is a thousand wake-ups a
  second on every rank, competing with compute and with MPI calls made by
  other threads (raw 4 KiB all-reduces beside Horovod ran 10-30x faster at
  5 or 10 ms than at 1 ms). The price is latency: a collective waits for the
  next cycle, so an op that takes less than a cycle runs at most once per
  cycle. At 10 ms, 16 MiB all-reduces fell to about 80-90% of raw MPI; at
  5 ms they stay level with it, and 16 MiB is about where gradient buffers
  of the models we train start.
- HOROVOD_FUSION_THRESHOLD=128 MiB: Horovod's own default, set explicitly so
  that a stray variable cannot switch fusion off. Fusion turns a backward
  pass's many small all-reduces into one; it matters most where each call is
  expensive (Gloo here: 14x; across nodes) and costs two copies through the
  fusion buffer where calls are cheap (MPI over shared memory).
- OMPI_MCA_mpi_yield_when_idle=1: Open MPI busy-polls while it waits. With
  Horovod's background thread, the Python thread that spins (yielding) in
  `hvd.synchronize`, and the other rank on the same cores, a rank that never
  yields takes the core the other side needs to make progress.
- OMP_NUM_THREADS=1: one compute thread per rank when ranks fill the cores;
  more only oversubscribe them.

Not set here: process binding. The launcher starts ranks with
`--bind-to none`, so the background and the compute threads of a rank can
run on either core; binding a rank to one core puts all of its threads on
that core.
"""

from __future__ import annotations

from collections.abc import Mapping

# What Horovod 0.28.1 and Open MPI 4.1 use when nothing is set (read from their
# sources): the baseline the benchmarks compare against.
HOROVOD_DEFAULTS: Mapping[str, str] = {
    "HOROVOD_CYCLE_TIME": "1",  # milliseconds
    "HOROVOD_FUSION_THRESHOLD": str(128 * 1024 * 1024),  # bytes
    "OMPI_MCA_mpi_yield_when_idle": "0",
}

RECOMMENDED: Mapping[str, str] = {
    "HOROVOD_CYCLE_TIME": "5",
    "HOROVOD_FUSION_THRESHOLD": str(128 * 1024 * 1024),
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
