"""hpcdp's 1-rank step against the bare loop's inside one process, for `hpcdp bench train`.

Separate launches of the same 1-rank run move by several percent on a shared
machine, more than the 2% the overhead target allows. hpcdp.bench.step_overhead
instead alternates hpcdp's step and the bare step in blocks within one process,
so both see the same load; this module runs it once per image model, with the
model's training overrides and blocks sized from its measured step time.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

from hpcdp.bench import common

#: Wall time each block of steps should last: long enough for the timer, short
#: enough that the blocks of both sides interleave with the machine's changes in load.
BLOCK_MS = 500.0


def steps_per_block(step_ms: float, block_ms: float = BLOCK_MS) -> int:
    """Steps in a block of about `block_ms` for a step of `step_ms` (3 to 200)."""
    if not step_ms > 0:
        raise ValueError(f"step time must be positive, got {step_ms}")
    return max(3, min(200, round(block_ms / step_ms)))


def command(overrides: Sequence[str], blocks: int, steps: int, label: str) -> list[str]:
    """`python -m hpcdp.bench.step_overhead` for one model (its training overrides)."""
    return [sys.executable, "-m", "hpcdp.bench.step_overhead", "--blocks", str(blocks),
            "--steps", str(steps), "--warmup", str(steps), "--label", label,
            *overrides]


def run(overrides: Sequence[str], step_ms: float, blocks: int, label: str,
        timeout: float, env: dict[str, str]) -> dict[str, Any]:
    """The JSON line step_overhead printed for this model."""
    steps = steps_per_block(step_ms)
    done = subprocess.run(command(overrides, blocks, steps, label), capture_output=True,
                          text=True, timeout=timeout, env=env)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode or not lines:
        raise common.BenchError(f"step overhead of {label} failed:\n"
                                f"{(done.stdout + done.stderr)[-6000:]}")
    return dict(json.loads(lines[-1]), steps_per_block=steps)


def text(label: str, r: dict[str, Any]) -> str:
    """One printed line: both bare steps, and hpcdp's overhead over each."""
    return (f"  {label}: in one process, {r['blocks']} alternating blocks of "
            f"{r['steps_per_block']} steps: hpcdp {r['hpcdp_step_ms']:.2f} ms, bare "
            f"{r['bare_step_ms']:.2f} ms (torch's default SGD; overhead "
            f"{r['overhead_ms']:+.3f} ms, {r['overhead_share']:+.1%}), bare with hpcdp's "
            f"kernel {r['bare_same_kernel_step_ms']:.2f} ms (overhead "
            f"{r['own_overhead_ms']:+.3f} ms, {r['own_overhead_share']:+.1%})")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--overhead-blocks", type=int, default=8,
                   help="blocks per side of the in-process overhead measurement of each image "
                        "model (hpcdp.bench.step_overhead); 0: skip it")


def measure(labels_overrides: Sequence[tuple[str, list[str], float]], args: argparse.Namespace,
            env: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Each (label, training overrides with its own run.dir, 1-rank step ms): its
    in-process figures."""
    found = {}
    for label, overrides, step_ms in labels_overrides:
        found[label] = run(overrides, step_ms, args.overhead_blocks, label, args.timeout, env)
        print(text(label, found[label]), flush=True)
    return found
