"""Slurm's side effects: sbatch, and the script files --out/--save write."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path

from hpcdp import files
from hpcdp.cluster.render import RenderError


def submit(script: str, sbatch: str = "sbatch", args: Sequence[str] = (),
           timeout: float = 60.0) -> str:
    """Submit a rendered script (on stdin, nothing written) and return the job id."""
    try:
        done = subprocess.run([sbatch, "--parsable", *args], input=script, capture_output=True,
                              text=True, timeout=timeout, check=False)
    except FileNotFoundError:
        raise RuntimeError(f"{sbatch} not found: is Slurm's client installed here?") from None
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{sbatch} did not answer within {timeout:g}s: is Slurm's "
                           "controller reachable?") from None
    if done.returncode != 0:
        raise RuntimeError(f"sbatch failed (exit {done.returncode}): {done.stderr.strip()}")
    # --parsable prints "jobid" or "jobid;cluster".
    return done.stdout.strip().split(";")[0]


def check_target(flag: str, path: str, overwrite: bool) -> None:
    """Where --out/--save writes: refused before anything is rendered or submitted.

    A script someone edited by hand is lost when a render lands on it, so an
    existing file is replaced only when asked.
    """
    target = Path(path)
    if not path or "\0" in path:
        raise RenderError(f"{flag} {path!r}: expected a file path")
    if target.is_dir():
        raise RenderError(f"{flag} {path}: is a folder, not a file")
    if not target.parent.is_dir():
        raise RenderError(f"{flag} {path}: the folder {str(target.parent)!r} does not exist")
    if target.exists() and not overwrite:
        raise RenderError(f"{flag} {path}: already exists; pass --overwrite to replace it")


def write_script(path: str, script: str) -> None:
    """Write under a temporary name, then rename: a reader never sees half a script."""
    files.write_atomic(path, script)
