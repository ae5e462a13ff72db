"""Helpers every benchmark shares: sizes, bandwidth math, tables, JSON with metadata, plots.

Kept free of torch, Horovod and MPI imports so that the parent process of a
benchmark (which only launches ranks and reports) starts fast and so that the
pure parts can be unit-tested without a launcher.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import platform
import re
import socket
import statistics
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from hpcdp import files
from hpcdp.runtime.launcher import LAUNCHERS, RankRun, run_ranks

_UNITS = {"": 1, "B": 1, "K": 2**10, "KIB": 2**10, "M": 2**20, "MIB": 2**20,
          "G": 2**30, "GIB": 2**30, "KB": 10**3, "MB": 10**6, "GB": 10**9}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")


def parse_size(text: str) -> int:
    """Bytes in a size like '4KiB', '64MiB', '1M' (binary), '10MB' (decimal) or '4096'."""
    match = _SIZE_RE.match(text)
    if not match:
        raise ValueError(f"cannot read size {text!r}: expected a number and a unit like 4KiB")
    number, unit = match.groups()
    factor = _UNITS.get(unit.upper())
    if factor is None:
        raise ValueError(f"unknown unit {unit!r} in size {text!r}; use B, KiB, MiB, GiB or KB...")
    value = float(number) * factor
    if value < 1 or value != int(value):
        raise ValueError(f"size {text!r} is not a positive whole number of bytes")
    return int(value)


def parse_sizes(text: str, factor: int = 4) -> list[int]:
    """Sizes from 'LO..HI' (every `factor`-fold step) or a comma list ('4KiB,64MiB')."""
    if ".." in text:
        lo_text, hi_text = text.split("..", 1)
        lo, hi = parse_size(lo_text), parse_size(hi_text)
        if lo > hi:
            raise ValueError(f"size range {text!r} runs backwards")
        sizes = []
        size = lo
        while size <= hi:
            sizes.append(size)
            size *= factor
        return sizes
    sizes = [parse_size(part) for part in text.split(",") if part.strip()]
    if not sizes:
        raise ValueError(f"no sizes in {text!r}")
    return sorted(set(sizes))


def format_size(nbytes: int) -> str:
    """'4 KiB', '64 MiB': the binary unit that keeps the number whole when possible."""
    for unit, factor in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= factor:
            value = nbytes / factor
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{nbytes} B"


def algbw(nbytes: int, seconds: float) -> float:
    """Algorithm bandwidth in GB/s (1e9 bytes/s): the buffer size over the time of one op."""
    if seconds <= 0:
        raise ValueError(f"time must be positive, got {seconds}")
    return nbytes / seconds / 1e9


def allreduce_busbw(alg: float, nranks: int) -> float:
    """Bus bandwidth of an all-reduce, as nccl-tests defines it: algbw * 2(n-1)/n.

    A ring all-reduce moves 2(n-1)/n of the buffer through each rank's link, so
    busbw is comparable across rank counts and with the hardware's peak.
    """
    if nranks < 1:
        raise ValueError(f"rank count must be at least 1, got {nranks}")
    return alg * 2 * (nranks - 1) / nranks


def median(values: Iterable[float]) -> float:
    """The median: robust to the odd slow repeat on a machine shared with other work."""
    items = list(values)
    if not items:
        raise ValueError("median of no values")
    return float(statistics.median(items))


def format_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A plain-text table: first column left-aligned, the others right-aligned.

    Floats print with 3 significant digits; None prints as '-'.
    """

    def cell(value: Any) -> str:
        if value is None:
            return "-"
        if isinstance(value, float):
            if not math.isfinite(value):
                return str(value)
            return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
        return str(value)

    body = [[cell(v) for v in row] for row in rows]
    for row in body:
        if len(row) != len(headers):
            raise ValueError(f"row {row} has {len(row)} cells for {len(headers)} headers")
    widths = [max([len(h)] + [len(r[i]) for r in body]) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        pairs = enumerate(zip(cells, widths))
        parts = [c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in pairs]
        return "  ".join(parts).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), rule] + [line(r) for r in body])


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def machine_metadata() -> dict[str, Any]:
    """Where and when a figure was measured: without this a benchmark number means little."""
    return {
        "hostname": socket.gethostname(),
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": _version("torch"),
        "horovod": _version("horovod"),
        "mpi4py": _version("mpi4py"),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "loadavg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


def write_json(path: str | os.PathLike[str], payload: Mapping[str, Any]) -> Path:
    """Write `payload` plus machine metadata atomically (a reader never sees half a file)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    data = {"meta": machine_metadata(), **payload}
    return files.write_atomic(target, json.dumps(data, indent=2, sort_keys=False) + "\n")


def read_json(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a JSON file a worker wrote, naming the file when it is missing or broken."""
    target = Path(path)
    try:
        return json.loads(target.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"benchmark result {target} was not written") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"benchmark result {target} is not valid JSON: {err}") from None


Series = Mapping[str, tuple[Sequence[float], Sequence[float]]]


def plot_panels(
    path: str | os.PathLike[str],
    panels: Sequence[Mapping[str, Any]],
    title: str = "",
) -> Path:
    """Draw line panels side by side into a PNG.

    Each panel is a mapping with `series` ({label: (xs, ys)}) and optional
    `title`, `xlabel`, `ylabel`, `logx`, `logy`, `hline` (a reference value),
    `xticks` ({value: label}) and `styles` ({label: matplotlib line keywords}).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.8), squeeze=False)
    for ax, panel in zip(axes[0], panels):
        styles = panel.get("styles", {})
        for label, (xs, ys) in panel["series"].items():
            style = {"marker": "o", "markersize": 3, **styles.get(label, {})}
            ax.plot(xs, ys, label=label, **style)
        if panel.get("logx"):
            ax.set_xscale("log", base=2)
        if panel.get("logy"):
            ax.set_yscale("log")
        if panel.get("hline") is not None:
            ax.axhline(panel["hline"], color="grey", linewidth=0.8, linestyle=":")
        if panel.get("xticks"):
            ticks = panel["xticks"]
            ax.set_xticks(list(ticks), [ticks[t] for t in ticks], rotation=45, fontsize=8)
        ax.set_title(panel.get("title", ""))
        ax.set_xlabel(panel.get("xlabel", ""))
        ax.set_ylabel(panel.get("ylabel", ""))
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    if title:
        fig.suptitle(title)
    return _save_figure(fig, path)


def _save_figure(fig, path: str | os.PathLike[str]) -> Path:
    """Write `fig` as a PNG at `path` (parents made) and free it."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(target, dpi=110)
    plt.close(fig)
    return target


def plot_bars(
    path: str | os.PathLike[str],
    values: Mapping[str, float],
    ylabel: str,
    title: str = "",
    points: Mapping[str, Sequence[float]] | None = None,
) -> Path:
    """A bar per label (e.g. the median), with the individual repeats drawn as dots."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4.5))
    labels = list(values)
    ax.bar(labels, [values[k] for k in labels], color="#8fb3d9")
    for i, label in enumerate(labels):
        pts = (points or {}).get(label, [])
        ax.plot([i] * len(pts), pts, "k.", alpha=0.5)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, axis="y", alpha=0.3)
    return _save_figure(fig, path)


@dataclass(frozen=True)
class RunConfig:
    """One way of launching a benchmark's ranks: a launcher and the environment it gets."""

    name: str
    launcher: str
    env: Mapping[str, str] = field(default_factory=dict)
    #: Extra worker arguments of this configuration (e.g. what the worker measures).
    args: tuple[str, ...] = ()

    @property
    def uses_mpi(self) -> bool:
        """Whether the ranks are MPI processes (so raw mpi4py can run beside Horovod)."""
        return self.launcher in ("mpirun", "horovodrun")


def parse_config(spec: str, base: Mapping[str, RunConfig] | None = None) -> RunConfig:
    """A configuration from 'NAME=LAUNCHER[:K=V,K=V]' or 'NAME=BASE+K=V,...'.

    'cyc5=mpirun:HOROVOD_CYCLE_TIME=5' launches under mpirun with that variable;
    'cyc5=mpi-hpcdp+HOROVOD_CYCLE_TIME=5' starts from a named configuration.
    """
    name, sep, rest = spec.partition("=")
    if not sep or not name.strip() or not rest.strip():
        raise ValueError(f"configuration {spec!r} must look like NAME=LAUNCHER[:K=V,...]")
    if "+" in rest:
        head, _, assigns = rest.partition("+")
    else:
        head, _, assigns = rest.partition(":")
    env: dict[str, str] = {}
    args: tuple[str, ...] = ()
    if head in LAUNCHERS:
        launcher = head
    elif base is not None and head in base:
        launcher = base[head].launcher
        env.update(base[head].env)
        args = base[head].args
    else:
        known = list(LAUNCHERS) + list(base or {})
        raise ValueError(f"configuration {spec!r}: unknown launcher or base {head!r}; "
                         f"choose one of {', '.join(known)}")
    for item in filter(None, (a.strip() for a in assigns.split(","))):
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise ValueError(f"configuration {spec!r}: {item!r} is not KEY=VALUE")
        env[key] = value
    return RunConfig(name.strip(), launcher, env, args)


class BenchError(RuntimeError):
    """A benchmark's ranks failed or left no result: the message carries their output."""


def pythonpath() -> str:
    """PYTHONPATH for a child that must import this checkout's hpcdp, installed or not:
    the checkout first, then this process's PYTHONPATH."""
    root = str(Path(__file__).resolve().parents[2])
    return os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))


def pythonpath_env() -> dict[str, str]:
    """This process's environment with `pythonpath()`."""
    return {**os.environ, "PYTHONPATH": pythonpath()}


def run_worker(
    module: str,
    config: RunConfig,
    worker_args: Sequence[str],
    json_path: str | os.PathLike[str],
    np: int = 2,
    timeout: float = 600.0,
) -> dict[str, Any]:
    """Run `python -m module --worker --json PATH ...` on `np` ranks under `config`, bounded.

    Returns the JSON rank 0 wrote. The package's own directory goes on
    PYTHONPATH so that workers import this checkout even when it is not installed.
    """
    env = {**config.env, "PYTHONPATH": pythonpath()}
    path = Path(json_path)
    path.unlink(missing_ok=True)
    argv = [sys.executable, "-m", module, "--worker", "--json", str(path), *worker_args,
            *config.args]
    run = run_ranks(argv, np=np, launcher=config.launcher, timeout=timeout, env=env)
    if not run.ok:
        raise BenchError(f"configuration {config.name!r} failed:\n{run.describe()[-6000:]}")
    return read_json(path)


def train_ranks(train_args: Sequence[str], np: int = 2, timeout: float = 600.0) -> RankRun:
    """`python -m hpcdp.train ARGS` on `np` ranks under mpirun, bounded: the RankRun
    (the caller decides what a failure means: a diverged run is a result)."""
    env = {"PYTHONPATH": pythonpath()}
    return run_ranks([sys.executable, "-m", "hpcdp.train", *train_args], np=np,
                     launcher="mpirun", timeout=timeout, env=env)
