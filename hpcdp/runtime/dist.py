"""The Horovod runtime as the training loop sees it.

Init (with hpcdp's runtime settings and Horovod's knobs set in the environment
first, so that a plain launcher command runs as fast as the benchmarks), one
device per local rank, the per-rank identity line, cross-rank agreement on errors, metric
reduction, and the rule that an unexpected failure on one rank takes the whole
job down instead of leaving the others waiting in a collective forever.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import sys
import traceback
from collections.abc import Callable, Iterator, MutableMapping, Sequence, Set
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import horovod.torch as hvd
import torch

from hpcdp.config import HorovodConfig
from hpcdp.runtime import build_guard, hvd_build, hvd_settings, thread_plan
from hpcdp.runtime.placement import (
    PlacementError,
    RankPlacement,
    check_placement,
    choose_gpu,
    gpu_cpus,
    launch_mismatch,
    node_gpu_count,
    node_name,
    placement_message,
    visible_devices,
)
from hpcdp.runtime.watchdog import waiting


class AgreedError(RuntimeError):
    """A failure every rank knows about and raises together: a clean exit, not an abort."""


#: What init chose for this process (threads, yielding and why), for the identity line.
_runtime: thread_plan.RuntimePlan | None = None


def init(hc: HorovodConfig, run_dir: Path, on_gpu: bool = False,
         environ: MutableMapping[str, str] | None = None,
         cpu_bind: str = "auto") -> thread_plan.RuntimePlan:
    """Apply hpcdp's runtime settings, then hvd.init() (a collective every rank reaches first).

    `on_gpu`: whether gradients will live on GPUs (it decides the fusion threshold).
    Threads and MPI yielding follow thread_plan.plan_runtime for the CPUs this
    rank may use, unless exported; they go into the environment before hvd.init()
    starts MPI. A malformed OMP_NUM_THREADS is an AgreedError on every rank alike.
    On CPUs (`cpu_bind` auto) a rank whose launcher left the node's ranks sharing
    one mask is pinned to its share (thread_plan.cpu_share) before Horovod and MPI
    start their threads, which inherit it.
    """
    global _runtime
    environ = os.environ if environ is None else environ
    view = thread_plan.probe()
    try:
        plan = thread_plan.apply(environ, view)
    except ValueError as exc:
        raise AgreedError(str(exc)) from exc
    if not on_gpu and cpu_bind == "auto":
        share = thread_plan.cpu_share(view, plan.local_ranks, thread_plan.local_rank(environ),
                                       environ, plan.threads)
        if share and thread_plan.pin_process(share):
            plan = dataclasses.replace(plan, pinned=share)
    torch.set_num_threads(plan.threads)
    env = hvd_settings.horovod_env(hc, run_dir, on_gpu, environ, hvd_settings.horovod_wakes(),
                                   hvd_settings.horovod_patches())
    if "HOROVOD_TIMELINE" in env:
        Path(env["HOROVOD_TIMELINE"]).parent.mkdir(parents=True, exist_ok=True)
    environ.update(env)
    build = hvd_build.installed_build(environ)
    try:  # under Gloo: before Horovod's first negotiation, which a mixed job would hang in
        checked = build_guard.check_before_init(build, environ)
    except build_guard.BuildMismatch as exc:
        raise AgreedError(str(exc)) from exc
    hvd.init()
    mismatch = launch_mismatch(hvd.size(), environ)
    if mismatch:  # every task alone in its world: no collective can hang here
        raise AgreedError(mismatch)
    if checked is None and hvd.size() > 1:  # the MPI controller: an allgather is safe
        try:
            build_guard.check_gathered(build, hvd.rank(), lambda mine: hvd.allgather_object(
                mine, name="hpcdp.runtime.build"))
        except build_guard.BuildMismatch as exc:
            raise AgreedError(str(exc)) from exc
    if hvd.local_size() != plan.local_ranks and "OMP_NUM_THREADS" in plan.env:
        # A launcher whose variables thread_plan does not know: threads follow Horovod's
        # count of local ranks now (yielding was decided before MPI started and stays).
        plan = thread_plan.rethread(plan, hvd.local_size(), environ)
        environ.update(plan.env)
        torch.set_num_threads(plan.threads)
    _runtime = plan
    return plan


def settings_line() -> str:
    """What this rank runs with and why: 'threads 1 (2 CPUs / 2 local ranks), yield on
    (4 busy threads > 2 CPUs), fusion 1 MiB'."""
    fusion = int(os.environ.get("HOROVOD_FUSION_THRESHOLD", str(hvd_settings.HOROVOD_FUSION_BYTES)))
    plan = _runtime.describe() if _runtime else f"threads {torch.get_num_threads()}"
    wake = hvd_settings.wake_text(os.environ, hvd_settings.horovod_wakes())
    return f"{plan}, fusion {hvd_settings.format_bytes(fusion)}, {wake}"


def oversubscription() -> str | None:
    """A warning where this rank's compute threads and those of the ranks sharing its
    CPUs outnumber them (only an exported thread count does that: hpcdp's rule never
    does), else None. OpenMP threads then wait for each other's time slices at every
    barrier: 2 ranks x 2 threads on 2 cores trained 10x slower than 1 thread each."""
    plan = _runtime
    if plan is None or not plan.oversubscribed:
        return None
    return (f"{plan.sharers} local rank(s) x {plan.threads} compute thread(s) share "
            f"{plan.cpus:g} CPU(s): oversubscribed ({plan.threads_why}); unset "
            "OMP_NUM_THREADS to let hpcdp choose, or give each rank more CPUs")


def wants_gpu(kind: str, cuda_available: bool) -> bool:
    """Whether run.device `kind` (auto | cpu | cuda) puts this rank on a GPU (pure)."""
    return kind == "cuda" or (kind == "auto" and cuda_available)


def choose_device(kind: str, local_rank: int, cuda_available: bool, device_count: int,
                  visible: str | None, node_gpus: int | None = None,
                  affinity: Set[int] | None = None, near: Sequence[Set[int] | None] = (),
                  where: str = "this rank") -> torch.device:
    """This rank's device: a GPU by hpcdp.runtime.placement.choose_gpu, or the CPU.

    `kind` is auto | cpu | cuda. Pure, so the placement rule is testable without GPUs.
    """
    if not wants_gpu(kind, cuda_available):
        return torch.device("cpu")
    if not cuda_available or device_count < 1:
        raise AgreedError("run.device='cuda' but no CUDA device is visible to this rank")
    ids = visible_devices(visible) or []
    if len(ids) != device_count:
        ids = [str(i) for i in range(device_count)]
    try:
        index = choose_gpu(ids, local_rank, node_gpus, affinity, near, where)
    except PlacementError as exc:
        raise AgreedError(f"{exc}; start at most one rank per GPU") from exc
    return torch.device("cuda", index)


def _pci_address(index: int) -> str | None:
    """The PCI address of CUDA device `index` ("0000:3b:00.0"), if PyTorch reports it."""
    props = torch.cuda.get_device_properties(index)
    bus = getattr(props, "pci_bus_id", None)
    if bus is None:
        return None
    return (f"{getattr(props, 'pci_domain_id', 0):04x}:{bus:02x}:"
            f"{getattr(props, 'pci_device_id', 0):02x}.0")


def _where() -> str:
    return f"rank {hvd.rank()} on {node_name(os.environ, socket.gethostname())}"


def pin_device(kind: str) -> torch.device:
    """Choose this rank's device and make it current."""
    cuda = torch.cuda.is_available()
    count = torch.cuda.device_count() if cuda else 0
    near = gpu_cpus([_pci_address(i) for i in range(count)]) if wants_gpu(kind, cuda) else []
    device = choose_device(kind, hvd.local_rank(), cuda, count,
                           os.environ.get("CUDA_VISIBLE_DEVICES"), node_gpu_count(os.environ),
                           os.sched_getaffinity(0), near, _where())
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device


def gpu_id(device: torch.device) -> str | None:
    """The GPU this rank uses (or, on CPU, would use), as CUDA_VISIBLE_DEVICES names it."""
    ids = visible_devices(os.environ.get("CUDA_VISIBLE_DEVICES")) or []
    if device.type == "cuda":
        return ids[device.index] if device.index is not None and device.index < len(ids) \
            else str(device.index)
    try:
        return ids[choose_gpu(ids, hvd.local_rank(), node_gpu_count(os.environ))] if ids else None
    except PlacementError:
        return None


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
        "gpu": gpu_id(device),
        "device": str(device),
        "controller": "gloo" if hvd.gloo_enabled() else "mpi" if hvd.mpi_enabled() else "other",
        "fusion_threshold": int(os.environ.get("HOROVOD_FUSION_THRESHOLD", "-1")),
        "threads": torch.get_num_threads(),
        "mpi_yield": thread_plan.yielding(os.environ),
        "settings": settings_line(),
        "horovod": hvd_build.installed_build().describe(),
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
    with waiting("allgather hpcdp.runtime.placement"):
        ranks = hvd.allgather_object(placement(device), name="hpcdp.runtime.placement")
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
    """Collective: the sum over ranks of a few numbers (float64, so counts stay exact).

    One rank's sum is its own numbers: no round trip through Horovod's thread."""
    if hvd.size() == 1:
        return [float(v) for v in values]
    t = torch.tensor(list(values), dtype=torch.float64)
    with waiting(f"allreduce {name}"):
        return hvd.allreduce(t, op=hvd.Sum, name=name).tolist()


def gather_rows(values: list[float], name: str) -> list[list[float]]:
    """Collective: an equally long row of numbers from every rank, in rank order."""
    with waiting(f"allgather {name}"):
        row = torch.tensor([values], dtype=torch.float64)
        return hvd.allgather(row, name=name).tolist()


def start_allreduce_max_int(value: int, name: str) -> Callable[[], int]:
    """Start the largest-integer all-reduce; returns a function that waits for its result."""
    with waiting(f"allreduce {name} (start)"):
        handle = hvd.allreduce_async(torch.tensor([value], dtype=torch.int32), op=hvd.Max,
                                     name=name)

    def wait() -> int:
        with waiting(f"allreduce {name}"):
            return int(hvd.synchronize(handle).item())

    return wait


def start_average_(t: torch.Tensor, name: str) -> Callable[[], None]:
    """Start averaging `t` over the ranks in place; returns a function that waits for it.

    Every rank receives the same reduced values, so the ranks hold bitwise-equal
    copies afterwards."""
    with waiting(f"allreduce {name} (start)"):
        handle = hvd.allreduce_async_(t, op=hvd.Average, name=name)

    def wait() -> None:
        with waiting(f"allreduce {name}"):
            hvd.synchronize(handle)

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


# --------------------------------------------------------------------------- the collectives
# Every Horovod collective the training package uses goes through one of these, so a
# reader sees in one place what every rank must reach (the optimizer wrappers and the
# gradient buckets reduce gradients themselves).


def rank() -> int:
    return hvd.rank()


def size() -> int:
    return hvd.size()


def allgather_object(obj: Any, name: str) -> list[Any]:
    """Collective: every rank's `obj` (picklable), in rank order."""
    return hvd.allgather_object(obj, name=name)


def broadcast_object(obj: Any, name: str) -> Any:
    """Collective: rank 0's `obj` on every rank."""
    return hvd.broadcast_object(obj, root_rank=0, name=name)


def allgather_tensor(t: torch.Tensor, name: str) -> torch.Tensor:
    """Collective: every rank's rows concatenated in rank order (row counts may differ)."""
    return hvd.allgather(t, name=name)


def broadcast_start(model: torch.nn.Module, optimizers: Sequence[Any]) -> None:
    """Collective: rank 0's parameters and optimizer state on every rank.

    A fresh optimizer has no state to send (Horovod would fill it with a dummy
    step first); a resumed one has it on every rank.
    """
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    for opt in optimizers:
        if opt.state:
            hvd.broadcast_optimizer_state(opt, root_rank=0)


def sync_batchnorm_class() -> type[torch.nn.Module]:
    """Horovod's SyncBatchNorm (statistics all-reduced in every training forward)."""
    return hvd.SyncBatchNorm


def distributed_optimizer(base: Any, named_parameters: Sequence[tuple[str, Any]],
                          hc: HorovodConfig, sparse_as_dense: bool = False) -> Any:
    """Horovod's DistributedOptimizer over `base`, configured from the [horovod] section.

    `sparse_as_dense`: sparse gradients are made dense and all-reduced, instead of
    all-gathered as rows and ids.
    """
    return hvd.DistributedOptimizer(
        base,
        named_parameters=named_parameters,
        compression=hvd.Compression.fp16 if hc.compression == "fp16" else hvd.Compression.none,
        backward_passes_per_step=hc.backward_passes_per_step,
        op=hvd.Adasum if hc.op == "adasum" else hvd.Average,
        gradient_predivide_factor=hc.gradient_predivide_factor,
        sparse_as_dense=sparse_as_dense,
    )


def shutdown_and_exit(code: int) -> None:
    """Shut Horovod (and MPI) down, then leave without the interpreter's teardown.

    With parallel HDF5, MPI_Finalize also terminates the HDF5 library; h5py's
    module teardown afterwards calls into it and can crash the process at exit,
    and so can closing the readers' files, so the read-only input files stay open
    until HDF5's own termination. Outputs are closed and flushed by now, so
    skipping the teardown loses nothing. Does nothing if Horovod never started.
    """
    import logging

    if not hvd.is_initialized():
        return
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    hvd.shutdown()
    os._exit(code)
