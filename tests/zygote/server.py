"""A Python that has imported torch once and forks a test's rank from that state.

Most of a training rank's start is importing torch and torch._dynamo (which the first
optimizer step imports): seconds of CPU, hundreds of times a suite. The test session
starts these servers (tests/conftest.py); the rank's own interpreter, started by the
real launcher, asks one for a fork (`sitecustomize.py` beside this file) and stays as
the rank's stand-in: it passes its arguments, environment, working directory, CPU set,
niceness and standard streams, forwards the signals it gets, and ends as the fork ends
(its exit status, or the same signal). The fork runs the rank's program from there on
as a fresh interpreter would: MPI, Horovod, hpcdp and the test's code are all first
imported in it, never here.

What differs from a fresh start, and why it is safe for these tests: the fork's parent
is this server, not the launcher (the stand-in is what the launcher watches, and the
server kills a fork whose stand-in dies, as the launcher would a rank); the modules
below are already imported (a server is used only for programs that import them);
Python's hash seed is the server's (the session starts two servers with different
seeds, and a rank's number picks one, so two ranks never share a seed). A request
whose environment differs from the server's in what these imports read at import
time is refused, and the interpreter starts as usual.

Run as ``python tests/zygote/server.py SOCKET``; it ends when its parent does.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import json
import os
import resource
import select
import signal
import socket
import sys

#: What the server imports before it forks: what costs a training rank most to import.
PRELOAD = ("numpy", "torch", "torch._dynamo")

#: Environment read while PRELOAD is imported: a request must match the server on these.
IMPORT_TIME_PREFIXES = ("OMP_", "MKL_", "OPENBLAS_", "GOTO", "KMP_", "TORCH", "PYTORCH",
                        "CUDA", "NVIDIA", "LD_", "PYTHON", "MALLOC_", "NUMPY")
#: Read again by every fork, so these may differ.
REREAD = {"PYTHONPATH"}

#: Signals the fork gets Python's own handling of (a fresh interpreter's start).
DEFAULT_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2,
                   signal.SIGQUIT, signal.SIGCHLD, signal.SIGALRM)


#: Read by Intel's OpenMP runtime alone (libiomp5): no difference where it is not loaded
#: (torch's CPU builds use GNU OpenMP; scikit-learn sets these for every later process).
INTEL_OPENMP_PREFIX = "KMP_"


def import_time_env(env: dict[str, str]) -> dict[str, str]:
    """The part of `env` that the preloaded modules read when they are imported."""
    read = tuple(p for p in IMPORT_TIME_PREFIXES
                 if p != INTEL_OPENMP_PREFIX or _intel_openmp_loaded())
    return {k: v for k, v in env.items() if k.startswith(read) and k not in REREAD}


@functools.cache  # read once: the server loads nothing after its preload
def _intel_openmp_loaded() -> bool:
    with open("/proc/self/maps") as maps:
        return "libiomp" in maps.read()


def refusal(request: dict, own_env: dict[str, str],
            set_by_imports: dict[str, str]) -> str | None:
    """Why this server cannot stand for a fresh start of `request`, or None. A value the
    imports set themselves (a program started by a rank inherits it) is no difference."""
    if request.get("prefix") != os.path.realpath(sys.prefix):
        return f"another Python ({request.get('executable')})"
    theirs = {k: v for k, v in import_time_env(request["env"]).items()
              if set_by_imports.get(k) != v}
    ours = import_time_env(own_env)
    if theirs != ours:
        keys = sorted(k for k in theirs.keys() | ours.keys() if theirs.get(k) != ours.get(k))
        return f"environment differs in {', '.join(keys)}"
    return None


class Server:
    """The accept-and-reap loop: single-threaded, so every fork is a clean copy."""

    def __init__(self, path: str, own_env: dict[str, str],
                 set_by_imports: dict[str, str]) -> None:
        self.own_env, self.set_by_imports = own_env, set_by_imports
        self.parent = os.getppid()
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.listener.bind(path + ".new")
        os.rename(path + ".new", path)  # clients find it only once it listens
        self.listener.listen(128)
        self.forks: dict[int, socket.socket] = {}
        self.wake_r, wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)

    def serve(self) -> dict | None:
        """Serve until the parent ends (None); in a fork, the request it runs."""
        while os.getppid() == self.parent:
            conns = list(self.forks.values())
            ready, _, _ = select.select([self.listener, self.wake_r, *conns], [], [], 1.0)
            if self.wake_r in ready:
                os.read(self.wake_r, 4096)
            self.reap()
            for conn in conns:
                if conn in ready:
                    self.stand_in_gone(conn)
            if self.listener in ready:
                request = self.accept()
                if request is not None:
                    return request
        return None

    def accept(self) -> dict | None:
        conn, _ = self.listener.accept()
        try:
            data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
            request = json.loads(data)
            why = refusal(request, self.own_env, self.set_by_imports)
            if why or len(fds) != 3:
                conn.send(json.dumps({"refused": why or "no streams"}).encode())
                conn.close()
                for fd in fds:
                    os.close(fd)
                return None
        except (OSError, ValueError):
            conn.close()
            return None
        pid = os.fork()
        if pid == 0:
            self.become_fork(fds, conn)
            return request
        for fd in fds:
            os.close(fd)
        conn.send(json.dumps({"pid": pid}).encode())
        self.forks[pid] = conn
        return None

    def become_fork(self, fds: list[int], conn: socket.socket) -> None:
        signal.set_wakeup_fd(-1)
        for sig in DEFAULT_SIGNALS:
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for other in (self.listener, conn, *self.forks.values()):
            other.close()
        os.close(self.wake_r)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)

    def reap(self) -> None:
        while self.forks:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.forks.pop(pid, None)
            if conn is None:
                continue
            with contextlib.suppress(OSError):
                conn.send(json.dumps({"status": status}).encode())
            conn.close()

    def stand_in_gone(self, conn: socket.socket) -> None:
        """The stand-in's end closed (it was killed): kill its fork, as a launcher kills a
        rank whose process it watches."""
        for pid, c in list(self.forks.items()):
            if c is conn:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)


def become(request: dict, set_by_imports: dict[str, str]) -> None:
    """Turn this fork into the requested program's start: its place, its world, its path;
    with what the preloaded imports put in the environment, as they would have."""
    os.chdir(request["cwd"])
    os.umask(request["umask"])
    os.environ.clear()
    os.environ.update(request["env"])
    for key, value in set_by_imports.items():
        os.environ.setdefault(key, value)
    os.sched_setaffinity(0, request["cpus"])
    os.setpriority(os.PRIO_PROCESS, 0, request["nice"])
    for name, limits in request["limits"].items():
        if resource.getrlimit(getattr(resource, name)) != tuple(limits):
            resource.setrlimit(getattr(resource, name), tuple(limits))
    sys.executable = request["executable"]
    sys.argv[:] = request["argv"]
    sys.orig_argv[:] = request["orig_argv"]
    sys.path[:] = request["path"]
    import numpy as np

    np.random.seed()  # a fresh interpreter's unseeded generator, not the server's


def run(request: dict) -> None:
    """The program, as ``python -m MODULE`` or ``python SCRIPT`` would run it."""
    import runpy

    if request["module"]:
        runpy._run_module_as_main(request["module"], alter_argv=True)  # noqa: SLF001
        return
    import types

    main = types.ModuleType("__main__")
    main.__file__ = request["script"]
    main.__builtins__ = __builtins__
    sys.modules["__main__"] = main
    with open(request["script"], "rb") as source:
        code = compile(source.read(), request["script"], "exec")
    exec(code, main.__dict__)  # noqa: S102 - the test's own program, as python SCRIPT runs it


def main(path: str) -> int:
    os.environ.pop("PYTHONHASHSEED", None)  # this server's own seed, not its forks' request
    before = dict(os.environ)
    for name in PRELOAD:
        importlib.import_module(name)
    set_by_imports = {k: v for k, v in os.environ.items() if k not in before}
    request = Server(path, before, set_by_imports).serve()
    if request is None:
        return 0
    become(request, set_by_imports)
    run(request)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
