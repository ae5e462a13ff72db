"""The Horovod runtime as the training loop sees it.

Init (with Horovod's knobs set in the environment first), one device per local
rank, the per-rank identity line, cross-rank agreement on errors, metric
reduction, and the rule that an unexpected failure on one rank takes the whole
job down instead of leaving the others waiting in a collective forever.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import traceback
from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import horovod.torch as hvd
import torch

from hpcdp import hvd_settings
from hpcdp.config import HorovodConfig
from hpcdp.placement import (
    RankPlacement,
    check_placement,
    device_index_for_local_rank,
    node_name,
    placement_message,
)
from hpcdp.watchdog import waiting


class AgreedError(RuntimeError):
    """A failure every rank knows about and raises together: a clean exit, not an abort."""


def horovod_env(hc: HorovodConfig, run_dir: Path, on_gpu: bool = False,
                environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The HOROVOD_* variables for these options (pure: Horovod reads them at init).

    The fusion threshold: the config's, else one already in `environ`, else
    hpcdp's for the device and CPU backend (hvd_settings.fusion_threshold_bytes).
    """
    env: dict[str, str] = {}
    if hc.fusion_threshold_mb >= 0:
        env["HOROVOD_FUSION_THRESHOLD"] = str(int(hc.fusion_threshold_mb * 1024 * 1024))
    else:
        env.update(hvd_settings.fusion_env(environ or {}, on_gpu))
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


def init(hc: HorovodConfig, run_dir: Path, on_gpu: bool = False,
         environ: MutableMapping[str, str] | None = None) -> None:
    """Set Horovod's variables, then hvd.init() (a collective every rank reaches first).

    `on_gpu`: whether gradients will live on GPUs (it decides the fusion threshold).
    """
    environ = os.environ if environ is None else environ
    env = horovod_env(hc, run_dir, on_gpu, environ)
    if "HOROVOD_TIMELINE" in env:
        Path(env["HOROVOD_TIMELINE"]).parent.mkdir(parents=True, exist_ok=True)
    environ.update(env)
    hvd.init()


def wants_gpu(kind: str, cuda_available: bool) -> bool:
    """Whether run.device `kind` (auto | cpu | cuda) puts this rank on a GPU (pure)."""
    return kind == "cuda" or (kind == "auto" and cuda_available)


def choose_device(kind: str, local_rank: int, cuda_available: bool, device_count: int,
                  visible: str | None) -> torch.device:
    """One GPU per local rank; device 0 when the scheduler narrowed visibility to one GPU.

    `kind` is auto | cpu | cuda. Pure, so the placement rule is testable without GPUs.
    """
    if not wants_gpu(kind, cuda_available):
        return torch.device("cpu")
    if not cuda_available or device_count < 1:
        raise AgreedError("run.device='cuda' but no CUDA device is visible to this rank")
    try:
        index = device_index_for_local_rank(local_rank, device_count)
    except ValueError as exc:
        raise AgreedError(
            f"{exc} (CUDA_VISIBLE_DEVICES={visible!r}); start at most one rank per GPU"
        ) from exc
    return torch.device("cuda", index)


def pin_device(kind: str) -> torch.device:
    """Choose this rank's device and make it current."""
    cuda = torch.cuda.is_available()
    device = choose_device(kind, hvd.local_rank(), cuda, torch.cuda.device_count() if cuda else 0,
                           os.environ.get("CUDA_VISIBLE_DEVICES"))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device


def identity(device: torch.device) -> dict[str, Any]:
    """Who this rank is, where it runs, and what it was given (for logs and tests)."""
    return {
        "rank": hvd.rank(),
        "size": hvd.size(),
        "local_rank": hvd.local_rank(),
        "local_size": hvd.local_size(),
        "cross_rank": hvd.cross_rank(),
        "host": socket.gethostname(),
        "slurm_node": os.environ.get("SLURMD_NODENAME"),
        "slurm_job": os.environ.get("SLURM_JOB_ID"),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "device": str(device),
        "controller": "gloo" if hvd.gloo_enabled() else "mpi" if hvd.mpi_enabled() else "other",
        "fusion_threshold": int(os.environ.get("HOROVOD_FUSION_THRESHOLD", "-1")),
    }


def print_identity(device: torch.device) -> None:
    """Exactly one `hpcdp-rank {json}` line per rank on stdout."""
    print("hpcdp-rank " + json.dumps(identity(device), sort_keys=True), flush=True)


def placement(device: torch.device) -> RankPlacement:
    """Where this rank runs; its GPU by UUID, so two indices of one GPU compare equal."""
    gpu = None
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        gpu = str(getattr(props, "uuid", "") or f"index {device.index}")
    return RankPlacement(hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(),
                         node_name(os.environ, socket.gethostname()), gpu)


def placement_error(device: torch.device) -> str | None:
    """Collective: why this job's ranks are placed wrongly (two on one GPU, say), or None.

    One rank cannot see that a neighbour took the same GPU (each sees "one
    visible GPU, use it"); gathered, the UUIDs show it. NCCL would otherwise
    fail later with a less direct message, or the ranks would share the GPU.
    """
    with waiting("allgather hpcdp.placement"):
        ranks = hvd.allgather_object(placement(device), name="hpcdp.placement")
    return placement_message(check_placement(ranks))


def is_root() -> bool:
    return hvd.rank() == 0


def agree(local_error: str | None, what: str) -> None:
    """Collective: raise AgreedError on every rank if any rank reports an error.

    Used where ranks might see different things (a file visible on one node
    only), so that no rank goes on to a collective the others never reach.
    """
    with waiting(f"allgather hpcdp.agree.{what}"):
        errors = hvd.allgather_object(local_error, name=f"hpcdp.agree.{what}")
    bad = [(r, e) for r, e in enumerate(errors) if e]
    if not bad:
        return
    if len({e for _, e in bad}) == 1 and len(bad) == len(errors):
        raise AgreedError(bad[0][1])
    raise AgreedError("; ".join(f"rank {r}: {e}" for r, e in bad))


def allreduce_sum(values: Sequence[float], name: str) -> list[float]:
    """Collective: the sum over ranks of a few numbers (float64, so counts stay exact)."""
    t = torch.tensor(list(values), dtype=torch.float64)
    with waiting(f"allreduce {name}"):
        return hvd.allreduce(t, op=hvd.Sum, name=name).tolist()


def gather_floats(value: float, name: str) -> list[float]:
    """Collective: one number from every rank, in rank order (per-rank step times, say)."""
    with waiting(f"allgather {name}"):
        return hvd.allgather(torch.tensor([value], dtype=torch.float64), name=name).tolist()


def start_allreduce_max_int(value: int, name: str) -> Callable[[], int]:
    """Start the largest-integer all-reduce; returns a function that waits for its result."""
    with waiting(f"allreduce {name} (start)"):
        handle = hvd.allreduce_async(torch.tensor([value], dtype=torch.int32), op=hvd.Max,
                                     name=name)

    def wait() -> int:
        with waiting(f"allreduce {name}"):
            return int(hvd.synchronize(handle).item())

    return wait


def abort_job(code: int = 1) -> None:
    """End every rank of the job now: MPI_Abort under MPI, else exit (the launcher reaps)."""
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        if hvd.is_initialized() and hvd.size() > 1 and hvd.mpi_enabled():
            from mpi4py import MPI

            MPI.COMM_WORLD.Abort(code)
    finally:
        os._exit(code)


@contextmanager
def abort_on_error() -> Iterator[None]:
    """Around the part of the run that uses collectives: one rank's crash ends the job.

    AgreedError and SystemExit pass through (all ranks leave together); anything
    else prints its traceback with the rank and aborts the job when there are
    several ranks, since the others would otherwise wait in a collective forever.
    """
    try:
        yield
    except (AgreedError, SystemExit):
        raise
    except BaseException:
        rank = hvd.rank() if hvd.is_initialized() else -1
        size = hvd.size() if hvd.is_initialized() else 1
        sys.stderr.write(f"[hpcdp rank {rank}] fatal error, aborting the job:\n"
                         f"{traceback.format_exc()}")
        if size > 1:
            abort_job(1)
        raise
