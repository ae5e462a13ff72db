"""A test rank's start from a pre-imported server (server.py beside this file explains).

Python imports this at every start while this folder is on PYTHONPATH, as the test
session sets it. Unless HPCDP_ZYGOTE names servers and the program is one that imports
torch anyway (a training command or a torch-using test worker), it returns at once
and the interpreter starts as usual; so it does when no server answers or one refuses.
Otherwise this process stays as the rank's stand-in until the fork ends, and never
returns.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import socket
import sys

#: `python -m hpcdp SUBCOMMAND` forms that train or load a network (and import torch).
TORCH_COMMANDS = {"train", "eval", "export", "predict", "generate"}
#: Worker scripts (tests/parallel/workers) that never import torch: they start as usual.
NO_TORCH_WORKERS = {"build_guard", "clicks_check", "criteo_rss", "data_reader",
                    "fields_reader", "prep_parts", "token_reader"}
#: What the stand-in passes on to its fork.
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2,
             signal.SIGQUIT, signal.SIGALRM, signal.SIGCONT, signal.SIGWINCH)
#: Limits the fork takes on (an address-space cap, set for a fresh start's imports, is
#: never asked of a server: its process holds them already).
LIMITS = ("RLIMIT_CORE", "RLIMIT_CPU", "RLIMIT_FSIZE", "RLIMIT_NOFILE", "RLIMIT_STACK",
          "RLIMIT_NPROC", "RLIMIT_MEMLOCK")
#: Where the launchers put a rank's number, to pick a server (and its hash seed).
RANK_VARIABLES = ("OMPI_COMM_WORLD_RANK", "HOROVOD_RANK", "PMI_RANK", "PMIX_RANK")


def program() -> dict | None:
    """What this interpreter was asked to run, if a server may run it."""
    argv = sys.orig_argv[1:]
    if len(argv) >= 2 and argv[0] == "-m":
        module, args = argv[1], argv[2:]
        if module == "hpcdp.train" or (module == "hpcdp" and args[:1]
                                       and args[0] in TORCH_COMMANDS):
            return {"module": module, "script": None, "argv": list(sys.argv),
                    "path0": os.getcwd()}
        return None
    if argv and not argv[0].startswith("-"):
        script = os.path.realpath(argv[0])
        parent = os.path.dirname(script)
        name = os.path.splitext(os.path.basename(script))[0]
        if os.path.basename(parent) == "workers" and name not in NO_TORCH_WORKERS:
            return {"module": None, "script": argv[0], "argv": list(sys.argv),
                    "path0": parent}
    return None


def server_for_this_rank(servers: list[str]) -> str:
    rank = next((os.environ[v] for v in RANK_VARIABLES if os.environ.get(v, "").isdigit()),
                "0")
    return servers[int(rank) % len(servers)]


def capped() -> bool:
    """Whether this process's memory is capped (then it starts as usual)."""
    return any(resource.getrlimit(getattr(resource, name))[0] != resource.RLIM_INFINITY
               for name in ("RLIMIT_AS", "RLIMIT_DATA", "RLIMIT_RSS"))


def ask(servers: list[str], wanted: dict) -> None:
    """Have a server fork the program; never returns once one has."""
    if capped():
        return
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        conn.connect(server_for_this_rank(servers))
        request = {**wanted, "executable": sys.executable,
                   "prefix": os.path.realpath(sys.prefix), "env": dict(os.environ),
                   "cwd": os.getcwd(), "umask": _umask(), "nice": os.nice(0),
                   "cpus": sorted(os.sched_getaffinity(0)),
                   "limits": {n: resource.getrlimit(getattr(resource, n)) for n in LIMITS},
                   "orig_argv": list(sys.orig_argv), "path": [wanted["path0"], *sys.path]}
        socket.send_fds(conn, [json.dumps(request).encode()], [0, 1, 2])
        reply = json.loads(conn.recv(1 << 16) or b"{}")
    except (OSError, ValueError) as exc:
        conn.close()
        trace(wanted, f"no server: {exc}")
        return
    if "pid" not in reply:
        conn.close()
        trace(wanted, f"refused: {reply.get('refused')}")
        return
    trace(wanted, "forked")
    stand_in(conn, reply["pid"])


def trace(wanted: dict, outcome: str) -> None:
    """One line per start to HPCDP_ZYGOTE_TRACE's file, if set: how often a server served."""
    path = os.environ.get("HPCDP_ZYGOTE_TRACE")
    if path:
        with open(path, "a") as log:
            log.write(f"{outcome}\t{wanted['module'] or wanted['script']}\n")


def stand_in(conn: socket.socket, pid: int) -> None:
    """Be the fork's process for the launcher: pass signals on, end as it ends."""
    def forward(sig: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)

    for sig in FORWARDED:
        signal.signal(sig, forward)
    message = conn.recv(1 << 16)
    if not message:  # the server ended first: leave nothing of the rank behind
        forward(signal.SIGKILL, None)
        os._exit(1)
    status = json.loads(message)["status"]
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _hook() -> None:
    servers = [s for s in os.environ.get("HPCDP_ZYGOTE", "").split(",") if s]
    if not servers or "SLURM_JOB_ID" in os.environ:  # a job's steps are Slurm's to track
        return
    wanted = program()
    if wanted is not None:
        ask(servers, wanted)


_hook()
