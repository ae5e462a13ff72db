"""A tracker in its own process (hpcdp.train.tracking.process and .child), with a real
child process and sinks written for the test; the MLflow server check against real
loopback sockets."""

from __future__ import annotations

import http.server
import json
import logging
import signal
import socket
import threading
import time
from pathlib import Path

import pytest

from hpcdp.train.tracking import state
from hpcdp.train.tracking.mlflow_run import check_server
from hpcdp.train.tracking.process import TrackerProcess, child_environment
from hpcdp.train.tracking.records import Record

SINKS = '''
import json, logging, time
from pathlib import Path

class FileSink:
    """Appends what it is given to a JSON Lines file."""
    name = "test"

    def __init__(self, out, fail=False, hang=False, warn=False):
        self.out, self.fail, self.hang, self.warn = Path(out), fail, hang, warn

    def open(self, run_id):
        if self.fail:
            raise ConnectionError("no route to the server")
        self._write(["open", run_id])
        return run_id or "child-id"

    def log(self, records):
        if self.warn:  # the child's own warning, as its Worker gives them
            logging.getLogger("hpcdp.train.tracking").warning("tracker test: server slow")
        while self.hang:
            time.sleep(0.05)
        self._write(["log", [[r.kind, r.step, dict(r.values)] for r in records]])
        return records

    def log_model(self, folder):
        if not Path(folder).is_dir():
            raise FileNotFoundError(folder)
        self._write(["model", sorted(p.name for p in Path(folder).iterdir())])

    def finish(self, summary, stopped):
        self._write(["finish", summary, stopped])

    def _write(self, item):
        with self.out.open("a") as f:
            f.write(json.dumps(item) + "\\n")
'''


@pytest.fixture
def sink_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "sinks_for_test.py").write_text(SINKS)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    return tmp_path / "got.jsonl"


def spec(out: Path, **flags: bool) -> dict[str, object]:
    return {"factory": "sinks_for_test:FileSink", "args": {"out": str(out), **flags}}


def recs(kind: str, *steps: int) -> list[Record]:
    return [Record(kind, s, {"loss": 1.0 / s}, 100.0 + s) for s in steps]


def got(out: Path) -> list[list[object]]:
    return [json.loads(line) for line in out.read_text().splitlines()]


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def nice_of(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[16])  # field 19 of proc(5), counted after the command's ")"


def test_the_child_sends_in_order_remembers_the_run_and_stands_aside(
        tmp_path: Path, sink_module: Path) -> None:
    tracker = TrackerProcess("test", spec(sink_module), tmp_path, state.TrackerState(),
                             None, close_timeout_s=10.0)
    tracker.send(recs("train", 5, 10))
    tracker.send(recs("val", 10))
    assert tracker.proc is not None
    deadline = time.monotonic() + 10
    while not sink_module.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert nice_of(tracker.proc.pid) == 19  # below training
    tracker.proc.send_signal(signal.SIGTERM)  # a scheduler's signal to the job: rank 0's
    tracker.finish({"steps": 10, "loss": 0.1}, None)
    assert tracker.close(10.0)
    assert tracker.proc.returncode == 0
    assert got(sink_module) == [
        ["open", None],
        ["log", [["train", 5, {"loss": 0.2}], ["train", 10, {"loss": 0.1}]]],
        ["log", [["val", 10, {"loss": 0.1}]]],
        ["finish", {"steps": 10, "loss": 0.1}, None]]
    assert state.read(tmp_path, "test") == state.TrackerState("child-id",
                                                              {"train": 10, "val": 10})


def test_a_resumed_child_sends_what_the_run_missed_first(tmp_path: Path,
                                                         sink_module: Path) -> None:
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("\n".join(json.dumps({"kind": "train", "step": s, "time": 1.0,
                                             "loss": 0.5}) for s in (5, 10, 15)) + "\n")
    known = state.TrackerState("old-id", {"train": 5})
    tracker = TrackerProcess("test", spec(sink_module), tmp_path, known, (metrics, 10), 10.0)
    tracker.send(recs("train", 20))
    assert tracker.close(10.0)
    assert got(sink_module) == [["open", "old-id"], ["log", [["train", 10, {"loss": 0.5}]]],
                                ["log", [["train", 20, {"loss": 0.05}]]]]


def test_a_failing_tracker_warns_once_in_rank_0s_log_and_ends_at_once(
        tmp_path: Path, sink_module: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "hpcdp")
    tracker = TrackerProcess("test", spec(sink_module, fail=True), tmp_path,
                             state.TrackerState(), None, close_timeout_s=30.0)
    assert tracker.proc is not None
    tracker.proc.wait(10.0)  # it failed and exited without waiting for its input's end
    for step in range(1, 50):
        tracker.send(recs("train", step))
    t0 = time.monotonic()
    assert tracker.close(30.0)
    assert time.monotonic() - t0 < 2.0
    (only,) = warnings_of(caplog)
    assert "tracker test: failed" in only and "no route to the server" in only


def test_a_hanging_tracker_is_killed_at_the_bound(
        tmp_path: Path, sink_module: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "hpcdp")
    tracker = TrackerProcess("test", spec(sink_module, hang=True), tmp_path,
                             state.TrackerState(), None, close_timeout_s=30.0, queue_size=3)
    t0 = time.monotonic()
    for step in range(1, 2000):  # the pipe and the queue fill: later ones are dropped
        tracker.send(recs("train", step))
    assert time.monotonic() - t0 < 1.0  # sending never waits for the tracker
    assert not tracker.close(0.5)
    assert time.monotonic() - t0 < 5.0
    assert tracker.proc is not None and tracker.proc.returncode is not None
    (only,) = warnings_of(caplog)  # the drop warned; the kill after it only at debug
    assert "later ones are dropped" in only


def test_a_child_that_warned_is_killed_at_the_bound_without_a_second_warning(
        tmp_path: Path, sink_module: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "hpcdp")
    tracker = TrackerProcess("test", spec(sink_module, hang=True, warn=True), tmp_path,
                             state.TrackerState(), None, close_timeout_s=30.0)
    tracker.send(recs("train", 1))
    assert not tracker.close(1.0)  # the child warned, then hung: killed at rank 0's bound
    (only,) = warnings_of(caplog)  # the child's warning is the tracker's one
    assert only == "tracker test: server slow"


def test_the_model_goes_with_the_run_or_is_left_out_with_a_warning(
        tmp_path: Path, sink_module: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "hpcdp")
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    tracker = TrackerProcess("test", spec(sink_module), tmp_path, state.TrackerState(),
                             None, close_timeout_s=10.0)
    tracker.model(model)
    tracker.model(tmp_path / "missing")  # the tracker cannot store it: the run goes on
    tracker.finish({"steps": 1}, None)
    assert tracker.close(10.0)
    assert got(sink_module) == [["open", None], ["model", ["config.json"]],
                                ["finish", {"steps": 1}, None]]
    (only,) = warnings_of(caplog)
    assert "tracker test: could not store the model" in only and "missing" in only


def test_the_child_imports_this_hpcdp() -> None:
    env = child_environment({"PYTHONPATH": "/elsewhere", "X": "1"})
    first, rest = env["PYTHONPATH"].split(":", 1)
    assert (Path(first) / "hpcdp" / "train" / "tracking" / "child.py").exists()
    assert rest == "/elsewhere" and env["X"] == "1"


class Unauthorized(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - the standard library's name
        self.send_response(401)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_the_server_check_refuses_a_dead_or_silent_server_in_bounded_time() -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        refused = closed.getsockname()[1]
    with pytest.raises(ConnectionError, match="run.tracker_connect_timeout_s"):
        check_server(f"http://127.0.0.1:{refused}", 5.0)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        t0 = time.monotonic()
        with pytest.raises(ConnectionError, match="did not answer within 0.3 s"):
            check_server(f"http://127.0.0.1:{silent.getsockname()[1]}/", 0.3)
        assert time.monotonic() - t0 < 3.0
    server = http.server.HTTPServer(("127.0.0.1", 0), Unauthorized)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        check_server(f"http://127.0.0.1:{server.server_port}", 5.0)  # an answer: it is up
    finally:
        server.shutdown()
