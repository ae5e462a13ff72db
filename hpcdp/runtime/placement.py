"""Which GPU a rank uses, and whether a job's ranks are placed sanely.

Pure functions (sysfs read through a root that tests replace): the training and
the doctor gather one `RankPlacement` per rank and check the list here, so the
rules can be tested without a launcher or a GPU.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass
from pathlib import Path

from hpcdp.runtime.cpus import parse_cpu_list


class PlacementError(ValueError):
    """A rank cannot be given a GPU of its own; the message names the node and rank."""


def node_name(environ: Mapping[str, str], hostname: str) -> str:
    """The node a rank runs on: Slurm's node name when under Slurm, else the host name.

    Slurm's name is the one that tells nodes apart (several slurmd can share a
    host, as in a test cluster, and a host name may differ from the node name).
    """
    return environ.get("SLURMD_NODENAME") or hostname


def visible_devices(cuda_visible_devices: str | None) -> list[str] | None:
    """The device ids in CUDA_VISIBLE_DEVICES, or None when the variable is unset."""
    if cuda_visible_devices is None:
        return None
    return [d.strip() for d in cuda_visible_devices.split(",") if d.strip()]


def device_index_for_local_rank(local_rank: int, num_visible: int) -> int:
    """The CUDA device index (within what this process sees) a local rank should use.

    When the scheduler narrows each rank to one device (Slurm's per-task GPU
    binding), that device is index 0; when every rank sees all of the node's
    devices, local rank i takes device i.
    """
    if num_visible <= 0:
        raise ValueError("no visible GPU to bind to")
    if num_visible == 1:
        return 0
    if local_rank >= num_visible:
        raise ValueError(
            f"local rank {local_rank} has no GPU of its own: only {num_visible} visible "
            "(more ranks per node than GPUs)"
        )
    return local_rank


def physical_gpu(local_rank: int, cuda_visible_devices: str | None) -> str | None:
    """The physical GPU id (as named in CUDA_VISIBLE_DEVICES) this local rank binds to."""
    devices = visible_devices(cuda_visible_devices)
    if not devices:
        return None
    return devices[device_index_for_local_rank(local_rank, len(devices))]


def gpu_cpus(pci_addresses: Sequence[str | None], sysfs: str | Path = "/sys",
             ) -> list[frozenset[int] | None]:
    """The CPUs nearest each GPU (sysfs local_cpulist of its PCI device); None if unknown."""
    found: list[frozenset[int] | None] = []
    for address in pci_addresses:
        path = Path(sysfs) / "bus" / "pci" / "devices" / str(address).lower() / "local_cpulist"
        try:
            found.append(parse_cpu_list(path.read_text()) if address else None)
        except (OSError, ValueError):
            found.append(None)
    return found


def node_gpu_count(environ: Mapping[str, str]) -> int | None:
    """The GPUs this job step has on this node (Slurm's SLURM_GPUS_ON_NODE), if known."""
    value = environ.get("SLURM_GPUS_ON_NODE", "")
    return int(value) if value.isdigit() else None


def nearest_gpu(affinity: Set[int], near: Sequence[Set[int] | None]) -> int | None:
    """The one GPU whose CPUs hold more of `affinity` than any other's, else None."""
    shares = [len(affinity & cpus) if cpus else 0 for cpus in near]
    best = max(shares, default=0)
    if best == 0 or shares.count(best) != 1:
        return None
    return shares.index(best)


def choose_gpu(visible: Sequence[str], local_rank: int, node_gpus: int | None = None,
               affinity: Set[int] | None = None, near: Sequence[Set[int] | None] = (),
               where: str = "this rank") -> int:
    """Index into `visible` (the GPUs this rank sees) of the GPU it uses.

    One GPU seen: Slurm bound it to this rank (--gpus-per-task, --gpu-bind, ...),
    use it. All of the node's GPUs seen (`node_gpus` unknown, or as many): the one
    nearest this rank's CPUs (`near[i]`: GPU i's CPUs, against the rank's
    `affinity`) when one is nearer than the others, else the one at its local
    rank. Anything else (a share of the GPUs, more ranks than GPUs) is an error
    naming `where` (node and rank) and what it sees.
    """
    n = len(visible)
    seen = f"CUDA_VISIBLE_DEVICES={','.join(visible)}" if visible else "no GPU"
    if n == 1:
        return 0
    if n == 0:
        raise PlacementError(f"{where} sees {seen}")
    if node_gpus is not None and n != node_gpus:
        raise PlacementError(
            f"{where} sees {n} of the node's {node_gpus} GPUs ({seen}): one rank per GPU "
            "needs each rank to see one GPU (e.g. --gpus-per-task=1) or all of them")
    nearest = nearest_gpu(affinity, near) if affinity and len(near) == n else None
    if nearest is not None:
        return nearest
    if local_rank >= n:
        raise PlacementError(f"{where}: local rank {local_rank} has no GPU of its own: it sees "
                             f"only {n} ({seen}), more ranks on the node than GPUs")
    return local_rank


@dataclass(frozen=True)
class RankPlacement:
    """What one rank reports about itself."""

    rank: int
    size: int
    local_rank: int
    local_size: int
    host: str
    gpu: str | None  # physical GPU id or UUID this rank uses; None on CPU


def check_placement(ranks: Sequence[RankPlacement]) -> list[str]:
    """Problems with a job's rank layout; an empty list means it is consistent."""
    problems: list[str] = []
    n = len(ranks)
    sizes = {r.size for r in ranks}
    if sizes != {n}:
        problems.append(f"ranks disagree on the world size: {sorted(sizes)} reported, {n} ranks")
    seen = sorted(r.rank for r in ranks)
    if seen != list(range(n)):
        problems.append(f"ranks are not 0..{n - 1} exactly once: {seen}")
    by_host: dict[str, list[RankPlacement]] = defaultdict(list)
    for r in ranks:
        by_host[r.host].append(r)
    for host, members in sorted(by_host.items()):
        local = sorted(m.local_rank for m in members)
        if local != list(range(len(members))):
            problems.append(f"{host}: local ranks {local} are not 0..{len(members) - 1}")
        local_sizes = {m.local_size for m in members}
        if local_sizes != {len(members)}:
            problems.append(
                f"{host}: local size reported as {sorted(local_sizes)} "
                f"but {len(members)} ranks run there"
            )
        gpus: dict[str, list[int]] = defaultdict(list)
        for m in members:
            if m.gpu is not None:
                gpus[m.gpu].append(m.rank)
        for gpu, owners in sorted(gpus.items()):
            if len(owners) > 1:
                problems.append(f"{host}: ranks {owners} are all bound to GPU {gpu}")
    return problems


def placement_message(problems: Sequence[str]) -> str | None:
    """One error for a job's placement problems, with what to do about shared GPUs."""
    if not problems:
        return None
    hint = ""
    if any("bound to GPU" in p for p in problems):
        hint = (": start at most one rank per GPU (fewer ranks per node, or give each rank "
                "its own GPU, e.g. Slurm's --gpus-per-task=1 or CUDA_VISIBLE_DEVICES)")
    return "; ".join(problems) + hint


def launch_mismatch(size: int, environ: Mapping[str, str]) -> str | None:
    """Why this world cannot be the one srun started, or None (pure).

    With an srun MPI plugin that does not fit the MPI library (or none), every
    task starts as rank 0 of a world of its own, and all of them would write one
    run dir. Only a world of 1 is judged: mpirun inside a job step legitimately
    starts more ranks than the step has tasks.
    """
    tasks = environ.get("SLURM_STEP_NUM_TASKS", "")
    if size != 1 or not tasks.isdigit() or int(tasks) <= 1:
        return None
    plugin = environ.get("SLURM_MPI_TYPE")
    used = f"--mpi={plugin}" if plugin else "the site's MpiDefault"
    return (f"srun started {tasks} tasks but each is a world of 1 rank: srun's MPI plugin "
            f"({used}) does not fit this MPI library. Set HPCDP_SRUN_MPI (srun --mpi) to "
            "one that `srun --mpi=list` offers and the MPI supports (pmix for Open MPI; "
            "`hpcdp doctor` checks)")
