"""The CPUs this process may use: its affinity mask, its cpuset and its cgroup CPU quota.

Read from the kernel (`os.sched_getaffinity`, /proc/self/cgroup and the cgroup
files, v2 and v1), so that hpcdp's thread rule (hpcdp.runtime.hvd_settings) sees what
a scheduler or container gave the process, not the machine's core count. The
parsers are pure; `probe` is the only function that reads files. Any file that
is missing or unreadable counts as "no limit there".
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class CpuView:
    """What one process may run on.

    `affinity`: the CPUs of its affinity mask. `pool`: the CPUs of its cpuset
    (every online CPU when none is set): a mask smaller than the pool means a
    launcher bound the process, or the whole job was narrowed. `quota`: the
    cgroup's CPU bandwidth limit in CPUs (1.5 = 150 ms of CPU time per 100 ms),
    None when unlimited.
    """

    affinity: frozenset[int]
    pool: frozenset[int]
    quota: float | None = None

    @property
    def narrowed(self) -> bool:
        """Whether something (a launcher's binding, taskset) narrowed the mask below the cpuset."""
        return bool(self.affinity) and self.affinity < self.pool


def format_cpu_list(numbers: Iterable[int]) -> str:
    """The kernel's list format for a set of numbers (CPUs, ranks): {0, 1, 2, 5} -> '0-2,5'."""
    spans: list[list[int]] = []
    for n in sorted(set(numbers)):
        if spans and n == spans[-1][1] + 1:
            spans[-1][1] = n
        else:
            spans.append([n, n])
    return ",".join(f"{a}-{b}" if b > a else f"{a}" for a, b in spans)


def parse_cpu_list(text: str) -> frozenset[int]:
    """CPUs from the kernel's list format ('0-3,8,10-11'); empty text gives no CPUs."""
    cpus: set[int] = set()
    for part in filter(None, (p.strip() for p in text.strip().split(","))):
        lo, sep, hi = part.partition("-")
        try:
            first, last = int(lo), int(hi) if sep else int(lo)
        except ValueError:
            raise ValueError(f"cannot read CPU list {text!r}: {part!r} is not N or N-M") from None
        if last < first:
            raise ValueError(f"cannot read CPU list {text!r}: range {part!r} runs backwards")
        cpus.update(range(first, last + 1))
    return frozenset(cpus)


def parse_cpu_max(text: str) -> float | None:
    """CPUs allowed by a cgroup v2 `cpu.max` ('150000 100000' -> 1.5; 'max 100000' -> None)."""
    fields = text.split()
    if not fields or fields[0] == "max":
        return None
    period = int(fields[1]) if len(fields) > 1 else 100_000
    return int(fields[0]) / period if period > 0 else None


def parse_cfs_quota(quota_us: str, period_us: str) -> float | None:
    """CPUs allowed by cgroup v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us` (-1: no limit)."""
    quota, period = int(quota_us), int(period_us)
    return quota / period if quota > 0 and period > 0 else None


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """Controller -> cgroup path from /proc/self/cgroup ('' is the v2 unified hierarchy)."""
    paths: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        for controller in parts[1].split(",") if parts[1] else [""]:
            paths[controller] = parts[2]
    return paths


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _dirs_up(mount: Path, cgroup_path: str) -> list[Path]:
    """The process's cgroup folder and its ancestors up to the mount, innermost first.

    Inside a container the path may name a folder the container cannot see (its
    cgroup namespace starts lower); then only the mount itself is read.
    """
    inner = mount / cgroup_path.lstrip("/")
    if not inner.is_dir():
        return [mount]
    dirs = [inner]
    while dirs[-1] != mount and mount in dirs[-1].parents:
        dirs.append(dirs[-1].parent)
    return dirs


def _min_quota(values: list[float | None]) -> float | None:
    limits = [v for v in values if v is not None]
    return min(limits) if limits else None


def read_quota(root: Path, paths: dict[str, str]) -> float | None:
    """The tightest CPU quota over the process's cgroup and its ancestors (v2, else v1)."""
    if "" in paths and (root / "cgroup.controllers").exists():  # v2 mounted at root
        return _min_quota([_quota_v2(d) for d in _dirs_up(root, paths[""])])
    for name in ("cpu,cpuacct", "cpu"):
        mount = root / name
        if "cpu" in paths and mount.is_dir():
            return _min_quota([_quota_v1(d) for d in _dirs_up(mount, paths["cpu"])])
    return None


def _quota_v2(folder: Path) -> float | None:
    text = _read(folder / "cpu.max")
    return parse_cpu_max(text) if text else None


def _quota_v1(folder: Path) -> float | None:
    quota, period = _read(folder / "cpu.cfs_quota_us"), _read(folder / "cpu.cfs_period_us")
    return parse_cfs_quota(quota, period) if quota and period else None


def read_cpuset(root: Path, paths: dict[str, str]) -> frozenset[int]:
    """The CPUs of the process's cpuset (v2, else v1); empty when none can be read."""
    if "" in paths and (root / "cgroup.controllers").exists():
        candidates = [d / "cpuset.cpus.effective" for d in _dirs_up(root, paths[""])]
    else:
        candidates = [d / "cpuset.effective_cpus"
                      for d in _dirs_up(root / "cpuset", paths.get("cpuset", "/"))]
    for path in candidates:
        text = _read(path)
        if text and text.strip():
            return parse_cpu_list(text)
    return frozenset()


def online_cpus(sys_cpu: Path = Path("/sys/devices/system/cpu")) -> frozenset[int]:
    text = _read(sys_cpu / "online")
    if text and text.strip():
        return parse_cpu_list(text)
    return frozenset(range(os.cpu_count() or 1))


def probe(cgroup_root: Path = Path("/sys/fs/cgroup"),
          proc_cgroup: Path = Path("/proc/self/cgroup"),
          sys_cpu: Path = Path("/sys/devices/system/cpu")) -> CpuView:
    """This process's CpuView, read from the kernel now."""
    if hasattr(os, "sched_getaffinity"):
        affinity = frozenset(os.sched_getaffinity(0))
    else:  # macOS: no affinity masks
        affinity = frozenset(range(os.cpu_count() or 1))
    paths = parse_proc_cgroup(_read(proc_cgroup) or "")
    try:
        pool = read_cpuset(cgroup_root, paths) or online_cpus(sys_cpu)
        quota = read_quota(cgroup_root, paths)
    except ValueError:  # a cgroup file in a form we do not know: no limit from it
        pool, quota = online_cpus(sys_cpu), None
    return CpuView(affinity, pool | affinity, quota)
