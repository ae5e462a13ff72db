"""The 1-node measurement `hpcdp plan` starts from: a short real training run, or one read back.

A run folder holds what the model needs: metrics.jsonl (data, compute and
communication time per step, in windows), summary.json (ranks, global batch and
the gradient layout: each gradient's bytes in backward's order and the bucket
size) and config.toml (whether the global batch was fixed).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcdp.plan.model import Step, fixed_part_s, fused

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


class MeasureError(ValueError):
    """A run folder that cannot serve as a measurement."""


@dataclass(frozen=True)
class Measured:
    """One run's steady state and its layout."""

    run_dir: Path
    ranks: int
    global_batch: int
    global_batch_fixed: bool  # data.global_batch_size was set (not a per-rank batch)
    step_ms: float
    data_ms: float
    compute_ms: float
    comm_ms: float
    samples_per_s: float
    peak_lr: float | None
    layout: dict[str, Any]


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise MeasureError(f"{path}: missing (did the run finish?)") from None
    except json.JSONDecodeError as e:
        raise MeasureError(f"{path}: not valid JSON: {e}") from None


def read_records(path: Path) -> list[dict[str, Any]]:
    """metrics.jsonl's records; a line that is not JSON is named with its number."""
    if not path.exists():
        raise MeasureError(f"{path}: missing (was log.jsonl off?)")
    out = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise MeasureError(f"{path}:{number}: not valid JSON: {e}") from None
    return out


def read_run(run_dir: Path, warmup_steps: int) -> Measured:
    """A finished run's steady state after `warmup_steps` steps, and its gradient layout."""
    from hpcdp.bench.train import steady_state  # pure; the bench package's window arithmetic

    summary = _read_json(run_dir / "summary.json")
    try:
        figures = steady_state(read_records(run_dir / "metrics.jsonl"), warmup_steps)
    except ValueError as e:
        raise MeasureError(f"{run_dir}: {e}") from None
    try:
        with open(run_dir / "config.toml", "rb") as f:
            fixed = bool(tomllib.load(f).get("data", {}).get("global_batch_size"))
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise MeasureError(f"{run_dir / 'config.toml'}: {e}") from None
    return Measured(run_dir, int(summary["world_size"]), int(summary["global_batch"]), fixed,
                    figures["step_ms"], figures["data_ms"], figures["compute_ms"],
                    figures["comm_ms"], figures["samples_per_s"], summary.get("peak_lr"),
                    summary.get("gradients") or {})


def compute_ms(m: Measured) -> float:
    """A 1-rank step's compute: on one rank the step has no all-reduce, so what is not
    waiting for data is compute (the loop's own per-step work included)."""
    return max(m.step_ms - m.data_ms, m.compute_ms)


def step_of(m: Measured, backward_share: float, overlap: bool,
            fusion_bytes: int | None = None, half: Measured | None = None) -> Step:
    """The model's Step from a 1-rank run: its compute and data time per step and its
    gradients grouped as the run would group them on several ranks (flat buckets, else
    Horovod's fusion threshold, else `fusion_bytes`). `half`: the same at half the batch,
    which separates the compute's fixed part from its per-sample part."""
    if m.ranks != 1:
        raise MeasureError(f"{m.run_dir}: the measurement must be a 1-rank run (it had "
                           f"{m.ranks}): its compute has no communication in it")
    sizes = m.layout.get("tensor_bytes")
    if not sizes:
        raise MeasureError(f"{m.run_dir}/summary.json has no gradient layout (a run from "
                           "before `hpcdp plan`): run it again")
    threshold = m.layout.get("bucket_bytes") or fusion_bytes or m.layout.get("fusion_threshold")
    buckets = fused(sizes, int(threshold)) if threshold else tuple(sizes)
    compute = compute_ms(m) / 1000
    fixed = 0.0
    if half is not None:
        if half.ranks != 1 or 2 * half.global_batch != m.global_batch:
            raise MeasureError(f"{half.run_dir}: expected 1 rank at batch {m.global_batch // 2}"
                               f", found {half.ranks} at {half.global_batch}")
        fixed = fixed_part_s(compute, compute_ms(half) / 1000)
    return Step(compute, m.data_ms / 1000, m.global_batch, buckets, backward_share, overlap,
                fixed)


def measure(config: str, overrides: list[str], batch: int, threads: int | None,
            steps: int, warmup: int, timeout: float, keep: Path | None = None) -> Measured:
    """Train `steps` + `warmup` steps on 1 rank at `batch` samples a step; its Measured.

    `threads`: OMP_NUM_THREADS for the rank (a CPU node's cores over its ranks), so that
    one rank measures what one rank of the planned layout gets.
    """
    from hpcdp.bench import common
    from hpcdp.runtime.launcher import run_ranks

    window = max(1, min(warmup, steps, 5))
    with tempfile.TemporaryDirectory(prefix="hpcdp-plan-") as tmp:
        run_dir = keep or Path(tmp) / "run"
        argv = [sys.executable, "-m", "hpcdp.train", "--config", config, *overrides,
                f"run.dir={run_dir}", f"data.global_batch_size={batch}",
                f"run.max_steps={warmup + steps}", "run.epochs=100000",
                f"log.every_steps={window}", "log.tensorboard=false", "log.progress=false",
                "checkpoint.resume=none", "checkpoint.every_steps=0", "checkpoint.keep=1"]
        env = {"PYTHONPATH": common.pythonpath()}
        if threads:
            env["OMP_NUM_THREADS"] = str(threads)
        run = run_ranks(argv, np=1, launcher="mpirun", timeout=timeout, env=env)
        if not run.ok:
            raise MeasureError(f"the 1-rank measurement failed:\n{run.describe()[-4000:]}")
        return read_run(run_dir, warmup - warmup % window)


def cores() -> int:
    """CPUs this process may use."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
