"""tests/zygote: a rank forked from a pre-imported server behaves as a fresh start would.

One real server (torch imported) serves a worker script run the way a launcher runs a
rank: its arguments, path, folder, environment and exit status are its own; signals
sent to the process the launcher started reach it; killing that process kills it; and
whatever the server cannot stand for starts as usual."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ZYGOTE = Path(__file__).resolve().parents[1] / "zygote"
_spec = importlib.util.spec_from_file_location("zygote_hook", ZYGOTE / "sitecustomize.py")
hook = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(hook)  # the start-up hook as a module (here it forks nothing)

PROBE = """\
import json, os, signal, sys, time
report = {"argv": sys.argv, "path0": sys.path[0], "cwd": os.getcwd(), "name": __name__,
          "value": os.environ.get("PROBE_VALUE"), "pid": os.getpid(),
          "preloaded": "torch" in sys.modules, "horovod": "horovod" in sys.modules}
with open(os.environ["PROBE_OUT"], "w") as out:
    json.dump(report, out)
mode = sys.argv[1]
if mode == "signal":
    signal.signal(signal.SIGUSR1, lambda *_: sys.exit(7))
    time.sleep(60)
elif mode == "die":
    os.kill(os.getpid(), signal.SIGTERM)
elif mode == "sleep":
    time.sleep(60)
sys.exit(int(mode) if mode.isdigit() else 0)
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("zygote")
    path = str(folder / "s.sock")
    env = {k: v for k, v in os.environ.items() if k != "HPCDP_ZYGOTE"}
    proc = subprocess.Popen([sys.executable, str(ZYGOTE / "server.py"), path], env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert os.path.exists(path), "the server did not start"
    yield path
    proc.terminate()
    proc.wait(10)


def start(server: str, tmp_path: Path, mode: str, **env: str) -> tuple[subprocess.Popen, Path]:
    workers = tmp_path / "workers"
    workers.mkdir(exist_ok=True)
    (workers / "probe.py").write_text(PROBE)
    out = tmp_path / "report.json"
    full = {k: v for k, v in os.environ.items() if k != "HPCDP_ZYGOTE"}
    full.update(HPCDP_ZYGOTE=server, PROBE_OUT=str(out),
                PYTHONPATH=os.pathsep.join([str(ZYGOTE), full.get("PYTHONPATH", "")]), **env)
    proc = subprocess.Popen([sys.executable, "workers/probe.py", mode], cwd=tmp_path,
                            env=full)
    return proc, out


def report(out: Path, timeout: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if out.exists() and out.stat().st_size:
            return json.loads(out.read_text())
        time.sleep(0.05)
    raise AssertionError(f"{out} never written")


def test_a_forked_worker_sees_its_own_start_and_ends_with_its_status(server, tmp_path):
    proc, out = start(server, tmp_path, "5", PROBE_VALUE="mine")
    assert proc.wait(60) == 5
    seen = report(out)
    assert seen["preloaded"] and not seen["horovod"], seen
    assert seen["pid"] != proc.pid, "ran in the stand-in, not in a fork"
    assert seen["argv"] == ["workers/probe.py", "5"]
    assert seen["path0"] == str(tmp_path / "workers")
    assert seen["cwd"] == str(tmp_path) and seen["value"] == "mine" and seen["name"] == "__main__"


def test_a_fork_killed_by_a_signal_ends_its_stand_in_by_the_same_signal(server, tmp_path):
    proc, _ = start(server, tmp_path, "die")
    assert proc.wait(60) == -signal.SIGTERM


def test_signals_to_the_stand_in_reach_the_fork(server, tmp_path):
    proc, out = start(server, tmp_path, "signal")
    report(out)
    time.sleep(0.2)  # the handler is set right after the report is written
    proc.send_signal(signal.SIGUSR1)
    assert proc.wait(30) == 7


def test_killing_the_stand_in_kills_the_fork(server, tmp_path):
    proc, out = start(server, tmp_path, "sleep")
    fork = report(out)["pid"]
    assert fork != proc.pid
    proc.kill()
    proc.wait(10)
    deadline = time.monotonic() + 10
    while _alive(fork) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(fork), f"fork {fork} outlived its stand-in"


def test_an_environment_the_imports_read_differently_starts_as_usual(server, tmp_path):
    threads = str(int(os.environ.get("OMP_NUM_THREADS", "1")) + 1)
    proc, out = start(server, tmp_path, "0", OMP_NUM_THREADS=threads)
    assert proc.wait(60) == 0
    seen = report(out)
    assert seen["pid"] == proc.pid and not seen["preloaded"], seen


def test_intel_openmp_settings_are_no_difference_where_it_is_not_loaded(server, tmp_path):
    proc, out = start(server, tmp_path, "0", KMP_DUPLICATE_LIB_OK="True")
    assert proc.wait(60) == 0
    assert report(out)["pid"] != proc.pid, "refused for a setting nothing loaded reads"


def test_a_memory_capped_start_is_never_forked(server, tmp_path):
    import resource

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))

    workers = tmp_path / "workers"
    workers.mkdir()
    (workers / "probe.py").write_text(PROBE)
    env = {**os.environ, "HPCDP_ZYGOTE": server, "PROBE_OUT": str(tmp_path / "r.json"),
           "PYTHONPATH": str(ZYGOTE)}
    done = subprocess.run([sys.executable, "workers/probe.py", "0"], cwd=tmp_path, env=env,
                          preexec_fn=cap, timeout=60)
    assert done.returncode == 0
    assert not report(tmp_path / "r.json")["preloaded"]


@pytest.mark.parametrize(("orig_argv", "served"), [
    (["py", "-m", "hpcdp.train", "data.path=x"], True),
    (["py", "-m", "hpcdp", "export", "ckpt"], True),
    (["py", "-m", "hpcdp", "prep", "digits"], False),
    (["py", "-m", "hpcdp.cluster.layout"], False),
    (["py", "-c", "import torch"], False),
    (["py", "-X", "importtime", "-m", "hpcdp.train"], False),
    (["py", "tests/parallel/workers/hvd_ops.py"], True),
    (["py", "tests/parallel/workers/criteo_rss.py"], False),
    (["py", "scripts/anything.py"], False),
])
def test_only_programs_that_import_torch_anyway_are_forked(monkeypatch, orig_argv, served):
    monkeypatch.setattr(sys, "orig_argv", orig_argv)
    assert (hook.program() is not None) == served


def test_each_rank_number_picks_a_server_in_turn(monkeypatch):
    servers = ["a", "b"]
    picked = []
    for rank in ("0", "1", "2", "3"):
        monkeypatch.setenv("OMPI_COMM_WORLD_RANK", rank)
        picked.append(hook.server_for_this_rank(servers))
    assert picked == ["a", "b", "a", "b"]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False
