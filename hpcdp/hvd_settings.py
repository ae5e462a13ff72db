"""hpcdp's Horovod and Open MPI runtime settings, in one place.

Training, the Slurm scripts and the benchmarks all take their environment from
here, so that what is benchmarked is what runs. Pure: no imports of Horovod or
MPI, only dictionaries of environment variables (they must be set before
`hvd.init()` and before MPI starts, i.e. in the launcher's environment).

Why each value (measured with `hpcdp bench allreduce` and `hpcdp bench fusion`
on 2 ranks sharing 2 cores; see hpcdp/bench/README.md for the figures):

- HOROVOD_CYCLE_TIME: Horovod's background thread wakes every cycle and runs a
  small all-reduce to agree which tensors are ready, even when idle. On cores
  shared with compute that polling costs; PLACEHOLDER.
- HOROVOD_FUSION_THRESHOLD: PLACEHOLDER.
- OMPI_MCA_mpi_yield_when_idle=1: Open MPI busy-polls while waiting; with
  Horovod's background thread, the Python thread spinning in
  `hvd.synchronize` and the other rank on the same two cores, a rank that does
  not yield steals the core the other side needs to make progress.
- OMP_NUM_THREADS=1: one compute thread per rank when ranks fill the cores;
  more threads only oversubscribe them.
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
    "HOROVOD_FUSION_THRESHOLD": str(64 * 1024 * 1024),
    "OMPI_MCA_mpi_yield_when_idle": "1",
    "OMP_NUM_THREADS": "1",
}


def recommended_env(overrides: Mapping[str, str] | None = None) -> dict[str, str]:
    """hpcdp's settings for training runs, with `overrides` winning (e.g. from a config file)."""
    env = dict(RECOMMENDED)
    if overrides:
        env.update({k: str(v) for k, v in overrides.items()})
    return env


def default_env() -> dict[str, str]:
    """Horovod's and Open MPI's own defaults, set explicitly so a stray variable cannot leak in."""
    return dict(HOROVOD_DEFAULTS)
