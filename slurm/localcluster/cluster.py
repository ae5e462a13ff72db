"""A throwaway two-node Slurm cluster on this machine, for tests and demos.

MUNGE, slurmctld and two slurmd daemons (node1, node2; two CPUs and two fake
GPUs each) run with every file under one folder: key, sockets, config, state,
spools, logs. Nothing outside that folder is read or written besides the
fake GPU device nodes it creates inside it. `stop` ends exactly the daemons
that `start` started, by the pids in their pid files.

Deliberately independent of hpcdp (standard library only), so it can start a
cluster for any checkout. Needs root (slurmd runs jobs as their user, and
MUNGE and Slurm check ownership) and Slurm + MUNGE installed.

    python3 slurm/localcluster/cluster.py start DIR   # prints: export SLURM_CONF=...
    python3 slurm/localcluster/cluster.py stop DIR
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

NODES = ("node1", "node2")
CPUS_PER_NODE = 2
GPUS_PER_NODE = 2
PARTITION = "debug"
DAEMONS = ("munged", "slurmctld", "slurmd")
# (major, minor) of the character devices that stand in for GPUs: /dev/null, /dev/zero.
FAKE_GPU_DEVICES = ((1, 3), (1, 5))


class ClusterError(RuntimeError):
    """The cluster could not be started or stopped; the message says why and where to look."""


def missing_requirements() -> str | None:
    """Why this machine cannot run the cluster, or None if it can."""
    if os.geteuid() != 0:
        return "the local Slurm cluster needs root (slurmd, MUNGE and fake GPU device nodes)"
    missing = [
        b for b in ("munged", "munge", "slurmctld", "slurmd", "sbatch", "scontrol", "sinfo")
        if shutil.which(b) is None
    ]
    if missing:
        return f"Slurm/MUNGE commands not installed: {', '.join(missing)}"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def slurm_conf(root: Path, ctld_port: int, node_ports: dict[str, int]) -> str:
    """The slurm.conf text: every path under `root`, one slurmd per node on its own port."""
    host = socket.gethostname()
    lines = [
        "ClusterName=hpcdplocal",
        f"SlurmctldHost={host}(127.0.0.1)",
        f"SlurmctldPort={ctld_port}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        # cred_expire also sets how long a requeued job waits before it may start again
        # (default 120 s): short, so that the preemption tests stay quick.
        f"AuthInfo=socket={root / 'munge' / 'munge.socket'},cred_expire=5",
        # As a real site would: the batch scripts pass no --mpi unless told to.
        "MpiDefault=pmix",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "SchedulerType=sched/backfill",
        # Look at pending jobs (a requeued one waiting for its begin time) every few seconds.
        "SchedulerParameters=sched_interval=2,bf_interval=2",
        "GresTypes=gpu",
        "ReturnToService=2",
        "JobRequeue=1",
        "KillWait=10",
        "MinJobAge=600",
        "MailProg=/bin/true",
        "AccountingStorageType=accounting_storage/none",
        "JobAcctGatherType=jobacct_gather/none",
        "JobCompType=jobcomp/none",
        f"StateSaveLocation={root / 'state'}",
        f"SlurmdSpoolDir={root / 'spool' / '%n'}",
        f"SlurmctldPidFile={root / 'run' / 'slurmctld.pid'}",
        f"SlurmdPidFile={root / 'run' / 'slurmd-%n.pid'}",
        f"SlurmctldLogFile={root / 'log' / 'slurmctld.log'}",
        f"SlurmdLogFile={root / 'log' / 'slurmd-%n.log'}",
        # One TmpFS per node: two slurmd on one host otherwise collide on PMIx's app dirs.
        f"TmpFS={root / 'tmp%n'}",
        # One /tmp and /dev/shm per node for Open MPI too, as separate hosts have (prolog).
        f"TaskProlog={root / 'etc' / 'task-prolog.sh'}",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
    ]
    for name, port in node_ports.items():
        lines.append(
            f"NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} "
            f"CPUs={CPUS_PER_NODE} RealMemory=4000 Gres=gpu:{GPUS_PER_NODE} State=UNKNOWN"
        )
    nodes = ",".join(node_ports)
    lines.append(
        f"PartitionName={PARTITION} Nodes={nodes} Default=YES MaxTime=INFINITE "
        "State=UP OverSubscribe=YES"
    )
    return "\n".join(lines) + "\n"


def task_prolog(root: Path) -> str:
    """The TaskProlog script: each node's tasks keep Open MPI's session files and shared
    memory segments in that node's own folder.

    The fake nodes share one host name, /tmp and /dev/shm, where real nodes each have
    their own: there one job's files (the segments of a job step, named by its Slurm
    job and step ids; the session folders that PMIx removes when a step ends) can be
    touched by a job on the other node, which no real cluster does.
    """
    node_tmp = f"{root}/tmp$SLURMD_NODENAME"
    return ("#!/bin/sh\n"
            f'echo "export OMPI_MCA_orte_tmpdir_base={node_tmp}"\n'
            f'echo "export OMPI_MCA_btl_vader_backing_directory={node_tmp}"\n')


def _pid_files(root: Path) -> dict[str, Path]:
    run = root / "run"
    files = {"munged": run / "munged.pid", "slurmctld": run / "slurmctld.pid"}
    files.update({f"slurmd-{n}": run / f"slurmd-{n}.pid" for n in NODES})
    return files


def client_env(root: Path) -> dict[str, str]:
    """Environment for Slurm client commands (sbatch, squeue, ...) talking to this cluster."""
    env = dict(os.environ)
    env["SLURM_CONF"] = str(root / "etc" / "slurm.conf")
    return env


def _run(cmd: list[str], env: dict[str, str], what: str, log: Path | None = None) -> None:
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        tail = log.read_text(errors="replace")[-3000:] if log and log.exists() else ""
        raise ClusterError(
            f"{what} failed (exit {proc.returncode}): {' '.join(cmd)}\n"
            f"{proc.stdout}{proc.stderr}\n{log or ''}:\n{tail}"
        )


def _prepare(root: Path) -> None:
    """Make the folder tree, the MUNGE key, the fake GPUs, slurm.conf and gres.conf."""
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o755)  # munged insists that every directory above its socket is searchable
    for sub in ("munge", "etc", "state", "run", "log", "dev", *(f"spool/{n}" for n in NODES),
                *(f"tmp{n}" for n in NODES)):
        (root / sub).mkdir(parents=True, exist_ok=True)
    for sub in ("munge", "dev"):
        os.chmod(root / sub, 0o755)
    key = root / "munge" / "munge.key"
    if not key.exists():
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
    for i, (major, minor) in enumerate(FAKE_GPU_DEVICES[:GPUS_PER_NODE]):
        dev = root / "dev" / f"gpu{i}"
        if not dev.exists():
            os.mknod(dev, 0o666 | 0o020000, os.makedev(major, minor))  # S_IFCHR
    prolog = root / "etc" / "task-prolog.sh"
    prolog.write_text(task_prolog(root))
    prolog.chmod(0o755)
    ports = {n: _free_port() for n in NODES}
    (root / "etc" / "slurm.conf").write_text(slurm_conf(root, _free_port(), ports))
    last = GPUS_PER_NODE - 1
    (root / "etc" / "gres.conf").write_text(
        f"NodeName={NODES[0][:-1]}[1-{len(NODES)}] Name=gpu File={root / 'dev'}/gpu[0-{last}]\n"
    )


def _wait_nodes_idle(root: Path, timeout: float) -> None:
    env = client_env(root)
    deadline = time.monotonic() + timeout
    states = ""
    while time.monotonic() < deadline:
        proc = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%N %T"], env=env, capture_output=True, text=True,
            timeout=30,
        )
        states = proc.stdout.strip()
        seen = dict(line.split() for line in states.splitlines() if len(line.split()) == 2)
        if all(seen.get(n) == "idle" for n in NODES):
            return
        time.sleep(0.5)
    logs = "\n".join(
        f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}"
        for p in sorted((root / "log").glob("*.log"))
    )
    raise ClusterError(f"nodes not idle after {timeout:.0f}s; sinfo says:\n{states}\n{logs}")


def start(root: str | os.PathLike[str], timeout: float = 60.0) -> dict[str, str]:
    """Start MUNGE, slurmctld and one slurmd per node; return the client environment.

    On any failure, the daemons already started are stopped before raising.
    """
    why = missing_requirements()
    if why:
        raise ClusterError(why)
    root = Path(root).resolve()
    _prepare(root)
    env = client_env(root)
    conf = str(root / "etc" / "slurm.conf")
    daemon_env = {k: v for k, v in env.items() if not k.startswith("SLURM_")}
    daemon_env["SLURM_CONF"] = conf
    munge_dir = root / "munge"
    try:
        _run(
            [
                "munged", f"--socket={munge_dir / 'munge.socket'}",
                f"--key-file={munge_dir / 'munge.key'}", f"--pid-file={_pid_files(root)['munged']}",
                f"--log-file={root / 'log' / 'munged.log'}", f"--seed-file={munge_dir / 'seed'}",
            ],
            daemon_env, "munged", root / "log" / "munged.log",
        )
        # -i: ignore state left in the folder by an earlier run of this cluster.
        _run(["slurmctld", "-i", "-f", conf], daemon_env, "slurmctld",
             root / "log" / "slurmctld.log")
        for node in NODES:
            _run(["slurmd", "-N", node, "-f", conf], daemon_env, f"slurmd {node}",
                 root / "log" / f"slurmd-{node}.log")
        _wait_nodes_idle(root, timeout)
    except BaseException:
        stop(root)
        raise
    return env


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _cancel_jobs(root: Path, timeout: float) -> None:
    """Cancel every job and wait (bounded) until none is left, so no job step outlives slurmd."""
    env = client_env(root)
    try:
        subprocess.run(["scancel", "--full", "-u", "root"], env=env, capture_output=True,
                       timeout=30)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            proc = subprocess.run(["squeue", "-h", "-o", "%i %T"], env=env, capture_output=True,
                                  text=True, timeout=30)
            if proc.returncode != 0 or not proc.stdout.strip():
                return
            time.sleep(0.5)
    except (OSError, subprocess.TimeoutExpired):
        return


def stop(root: str | os.PathLike[str], timeout: float = 30.0) -> list[str]:
    """Stop the daemons started in `root` (by pid, TERM then KILL); return what was stopped."""
    root = Path(root).resolve()
    pid_files = _pid_files(root)
    if _read_pid(pid_files["slurmctld"]) is not None:
        _cancel_jobs(root, timeout)
    stopped: list[str] = []
    # The slurmd daemons first (together), so that no node reports to a controller
    # that is gone; then slurmctld and munged, which the others needed until then.
    for group in ([f"slurmd-{n}" for n in NODES], ["slurmctld", "munged"]):
        pids = {name: _read_pid(pid_files[name]) for name in group}
        live = {name: pid for name, pid in pids.items() if pid is not None and _pid_alive(pid)}
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
            for pid in live.values():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + wait
            while any(_pid_alive(p) for p in live.values()) and time.monotonic() < deadline:
                time.sleep(0.1)
            if not any(_pid_alive(p) for p in live.values()):
                break
        for name, pid in live.items():
            stopped.append(f"{name} (pid {pid})")
            pid_files[name].unlink(missing_ok=True)
    return stopped


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("start", "stop"))
    parser.add_argument("dir", help="folder that holds every file of the cluster")
    args = parser.parse_args(argv)
    try:
        if args.action == "start":
            env = start(args.dir)
            print(f"export SLURM_CONF={env['SLURM_CONF']}")
        else:
            for line in stop(args.dir):
                print(f"stopped {line}")
    except ClusterError as e:
        print(f"localcluster: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
