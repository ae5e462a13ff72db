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
- HOROVOD_FUSION_THRESHOLD=128 MiB: Horovod's own default, set explicitly so
  that a stray variable cannot switch fusion off. Fusion turns a backward
  pass's many small all-reduces into one; it matters most where each call is
  expensive (Gloo here: 14x; across nodes) and costs two copies through the
  fusion buffer where calls are cheap (MPI over shared memory).
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
    "HOROVOD_CYCLE_TIME": "1",
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
