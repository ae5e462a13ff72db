"""Start several ranks on this machine under a real launcher, with a time bound.

Used by the multi-rank tests and by the benchmarks. Building the command line
is a pure function (testable without MPI); `run_ranks` runs it in its own
process group and kills the whole group when the bound is reached, so a hung
rank can never block the caller.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from hpcdp.runtime.hvd_settings import GLOO_PAIR_VAR, GLOO_YIELD_VAR, recommended_env
from hpcdp.runtime.thread_plan import YIELD_VAR

LAUNCHERS = ("mpirun", "horovodrun", "horovodrun-gloo")


def _bin(name: str) -> str:
    """Prefer the launcher installed beside this interpreter (the venv's horovodrun)."""
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else name


def launch_command(
    argv: Sequence[str],
    np: int = 2,
    launcher: str = "mpirun",
    env_names: Sequence[str] = (),
    plain: bool = False,
) -> list[str]:
    """The command line that starts `argv` on `np` local ranks under `launcher`.

    `env_names` are variables forwarded explicitly (needed by mpirun on remote
    hosts; harmless locally). `plain`: the command as a user types it from the
    README (`mpirun -np 2 ...`, `horovodrun -np 2 -H localhost:2 ...`), with the
    launcher's own defaults (mpirun then binds each of up to 2 ranks to a core).
    """
    if np < 1:
        raise ValueError(f"np must be at least 1, got {np}")
    if launcher not in LAUNCHERS:
        raise ValueError(f"unknown launcher {launcher!r}; choose one of {', '.join(LAUNCHERS)}")
    if launcher == "mpirun" and plain:
        return ["mpirun", "-np", str(np), *argv]
    if launcher == "mpirun":
        cmd = [
            "mpirun",
            "-np",
            str(np),
            "--oversubscribe",
            "--bind-to",
            "none",
            "--tag-output",
            "--allow-run-as-root",
        ]
        for name in env_names:
            cmd += ["-x", name]
        return cmd + list(argv)
    cmd = [_bin("horovodrun"), "-np", str(np), "-H", f"localhost:{np}"]
    if launcher == "horovodrun-gloo":
        cmd.append("--gloo")
    elif not plain:
        cmd.append("--mpi")
    return cmd + list(argv)


#: hpcdp's runtime settings: what a plain run leaves to hpcdp's own rule.
SETTINGS_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", YIELD_VAR, "HOROVOD_CYCLE_TIME",
                 "HOROVOD_FUSION_THRESHOLD", GLOO_PAIR_VAR, GLOO_YIELD_VAR)


def rank_environment(extra: Mapping[str, str] | None = None, np: int = 2,
                     plain: bool = False) -> dict[str, str]:
    """The environment for local multi-rank runs.

    Open MPI refuses root without the two ALLOW variables. The Horovod and MPI
    runtime settings are hpcdp's rule for `np` ranks sharing this process's CPUs
    (hpcdp.runtime.hvd_settings), so that workers that do not call the rule themselves
    run what training runs; values already set win. `plain`: none of the
    settings, not even the caller's exports (what a user's plain command gets:
    training then applies the rule itself).
    """
    env = dict(os.environ)
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("HDF5_USE_FILE_LOCKING", "FALSE")
    if plain:
        for key in SETTINGS_VARS:
            env.pop(key, None)
    else:
        env.setdefault("OMPI_MCA_rmaps_base_oversubscribe", "1")
        for key, value in recommended_env(ranks=np).items():
            env.setdefault(key, value)
    if extra:
        env.update(extra)
    return env


@dataclass
class RankRun:
    """What a bounded multi-rank run left behind."""

    command: list[str]
    returncode: int
    output: str
    timed_out: bool
    seconds: float

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    def describe(self) -> str:
        state = "timed out" if self.timed_out else f"exit {self.returncode}"
        return f"{' '.join(self.command)} -> {state} after {self.seconds:.1f}s\n{self.output}"


def run_ranks(
    argv: Sequence[str],
    np: int = 2,
    launcher: str = "mpirun",
    timeout: float = 120.0,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    plain: bool = False,
) -> RankRun:
    """Run `argv` on `np` ranks; kill every process of the run after `timeout` seconds.

    `plain`: the README's command with none of hpcdp's settings exported
    (launch_command, rank_environment); `env` still applies on top.
    """
    cmd = launch_command(argv, np=np, launcher=launcher, plain=plain)
    start = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=rank_environment(env, np=np, plain=plain),
        cwd=cwd,
        start_new_session=True,
    )
    timed_out = False
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        kill_group(proc.pid)
        out, _ = proc.communicate()
        out += f"\n[hpcdp.runtime.launcher] killed after the {timeout:.0f}s bound\n"
    finally:
        # A launcher can exit while orphaned ranks still run; never leave them behind.
        kill_group(proc.pid, grace=0.0)
    return RankRun(cmd, proc.returncode, out, timed_out, time.monotonic() - start)


def kill_tree(pid: int, timeout: float = 30.0) -> None:
    """SIGKILL process `pid`, its process group and every process it started, at once, as a
    time limit does: an mpirun may start its ranks outside its own process group, and a
    rank left alive would finish the job on its own."""
    try:
        tree = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        tree = []
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    for child in tree:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()
    psutil.wait_procs(tree, timeout=timeout)


def kill_group(pgid: int, grace: float = 3.0) -> None:
    """SIGTERM a process group, then SIGKILL whatever is left after `grace` seconds."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)
