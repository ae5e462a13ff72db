"""Which GPU a local rank uses, and whether a job's ranks are placed sanely.

Pure functions: the doctor gathers one `RankPlacement` per rank and checks the
list here, so the rules can be tested without a launcher.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


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
