"""The trackers' pure parts: parameters, metric values, the commit buffer, the run-id
file, the group and store defaults; and the worker thread's bounds (a tracker that
fails, hangs or falls behind warns once and never holds the caller up)."""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path

import pytest

from hpcdp.train.tracking import state
from hpcdp.train.tracking.child import missed_records
from hpcdp.train.tracking.hub import group_of
from hpcdp.train.tracking.mlflow_run import chunks, store_uri
from hpcdp.train.tracking.records import (
    CommitBuffer,
    Record,
    catch_up,
    flat_params,
    numbers,
    parse_jsonl,
    scalars,
)
from hpcdp.train.tracking.wandb_run import settled
from hpcdp.train.tracking.worker import Worker, latest


def test_flat_params_names_every_key_as_the_config_file_would_read() -> None:
    tree = {"run": {"name": "a", "seed": 0, "trackers": ["mlflow"], "tf32": True},
            "model": {"kwargs": {"width": 8, "deep": {"x": None}}, "extra": {}},
            "optim": {"betas": [0.9, 0.999], "lr": 0.1}}
    assert flat_params(tree) == {
        "run.name": "a", "run.seed": "0", "run.trackers": '["mlflow"]', "run.tf32": "true",
        "model.kwargs.width": "8", "model.kwargs.deep.x": "null", "model.extra": "{}",
        "optim.betas": "[0.9, 0.999]", "optim.lr": "0.1"}


def test_numbers_keeps_numbers_only_under_kind_names() -> None:
    r = Record("train", 5, {"loss": 1.5, "epoch": 0, "nan_seen": True, "note": "x",
                            "acc": float("nan")})
    got = numbers(r)
    assert set(got) == {"train/loss", "train/epoch", "train/acc"}
    assert got["train/loss"] == 1.5 and got["train/epoch"] == 0.0


def test_scalars_of_a_summary() -> None:
    assert scalars({"val_acc": 0.5, "task": "image", "gradients": {"n": 1}, "checkpoint": None,
                    "bad": float("nan"), "steps": 30}) == {
        "val_acc": 0.5, "task": "image", "steps": 30}


def recs(kind: str, *steps: int) -> list[Record]:
    return [Record(kind, s, {"loss": float(s)}) for s in steps]


def steps_of(records: list[Record]) -> list[tuple[str, int]]:
    return [(r.kind, r.step) for r in records]


def test_commit_releases_what_a_checkpoint_covers_in_order() -> None:
    buf = CommitBuffer()
    for r in [*recs("train", 5, 10), *recs("val", 10), *recs("train", 15)]:
        buf.add(r)
    assert steps_of(buf.commit(10)) == [("train", 5), ("train", 10), ("val", 10)]
    assert buf.commit(10) == []
    assert buf.sent == {"train": 10, "val": 10}
    assert steps_of(buf.release_all()) == [("train", 15)]
    assert buf.release_all() == []


def test_a_stop_drops_what_no_checkpoint_covers() -> None:
    buf = CommitBuffer()
    for r in recs("train", 5, 10, 15):
        buf.add(r)
    assert steps_of(buf.commit(10)) == [("train", 5), ("train", 10)]
    assert buf.drop() == 1
    assert buf.release_all() == [] and buf.sent == {"train": 10}


def test_resumed_from_an_older_checkpoint_sends_no_step_twice() -> None:
    # The newest checkpoint (20) was unreadable: the run resumed from 10 and trains
    # 15 and 20 again, which the tracker run already holds.
    buf = CommitBuffer({"train": 20, "val": 20})
    for r in [*recs("train", 15, 20), *recs("val", 20), *recs("train", 25)]:
        buf.add(r)
    assert steps_of(buf.commit(30)) == [("train", 25)]
    assert buf.sent == {"train": 25, "val": 20}


def test_catch_up_sends_what_was_committed_but_never_sent(tmp_path: Path) -> None:
    # Killed after step 12: the tracker had 8; the checkpoint of 10 is resumed, so 10 is
    # owed, 12 is trained again. A half-written last line and a repeated validation
    # (a finished run resumed) are left out.
    lines = [json.dumps({"kind": k, "step": s, "time": 1.0 + s, "loss": 0.5})
             for k, s in [("train", 6), ("train", 8), ("train", 10), ("val", 10),
                          ("val", 10), ("train", 12)]] + ['{"kind": "train", "st']
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(lines))
    got = missed_records(path, 10, {"train": 8})
    assert steps_of(got) == [("train", 10), ("val", 10)]
    assert got[0].values == {"loss": 0.5} and got[0].time == 11.0
    assert steps_of(catch_up(parse_jsonl(lines), {}, 8)) == [("train", 6), ("train", 8)]
    assert missed_records(tmp_path / "none.jsonl", 10, {}) == []
    assert latest({"train": 8, "val": 5}, {"train": 6}, {"val": 10, "x": 1}) == {
        "train": 8, "val": 10, "x": 1}


def test_state_file_round_trip_and_refusals(tmp_path: Path) -> None:
    assert state.read(tmp_path, "mlflow") == state.TrackerState()
    state.write(tmp_path, "mlflow", "abc", {"train": 10})
    assert state.read(tmp_path, "mlflow") == state.TrackerState("abc", {"train": 10})
    assert state.path(tmp_path, "mlflow").parent.name == "trackers"
    for bad in ("[]", '{"run_id": 3}', '{"run_id": "a", "sent": {"train": "x"}}', "{"):
        with pytest.raises(ValueError):
            state.parse(bad)


def test_group_defaults(tmp_path: Path) -> None:
    run_dir = tmp_path / "sweep-lr" / "task-3"
    assert group_of("mine", run_dir, {"HPCDP_SWEEP": "x"}) == "mine"
    assert group_of("", run_dir, {"HPCDP_SWEEP": "x", "SLURM_ARRAY_JOB_ID": "7"}) == "sweep-lr"
    assert group_of("", run_dir, {"SLURM_ARRAY_JOB_ID": "7"}) == "array-7"
    assert group_of("", run_dir, {}) == ""


def test_store_uri_precedence(tmp_path: Path) -> None:
    env = {"MLFLOW_TRACKING_URI": "http://tracker:5000"}
    assert store_uri("http://mine:1", env, tmp_path) == "http://mine:1"
    assert store_uri("", env, tmp_path) == "http://tracker:5000"
    assert store_uri("", {}, tmp_path) == f"sqlite:///{tmp_path.resolve()}/trackers/mlflow.db"
    assert chunks(list(range(5)), 2) == [[0, 1], [2, 3], [4]]


class Sink:
    """A tracker that holds what it is sent, fails where told, or waits for `release`;
    `lost`: its store has no run of the id it is given."""

    name = "test"

    def __init__(self, fail_open: bool = False, block: bool = False,
                 lost: bool = False) -> None:
        self.fail_open, self.block, self.lost = fail_open, block, lost
        self.release = threading.Event()
        self.got: list[Record] = []
        self.finished: list[tuple[object, object]] = []

    def open(self, run_id: str | None) -> str:
        if self.fail_open:
            raise ConnectionError("no route to the server")
        return "new-id" if self.lost else run_id or "new-id"

    def log(self, records: list[Record]) -> list[Record]:
        if self.block:
            self.release.wait()
        self.got += records
        return records

    def finish(self, summary: object, stopped: object) -> None:
        self.finished.append((summary, stopped))


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_worker_sends_and_remembers_the_run(tmp_path: Path) -> None:
    sink = Sink()
    worker = Worker(sink, tmp_path, state.TrackerState())
    worker.send(recs("train", 5, 10))
    worker.finish({"steps": 10}, None)
    assert worker.close(5.0)
    assert steps_of(sink.got) == [("train", 5), ("train", 10)]
    assert sink.finished == [({"steps": 10}, None)]
    assert state.read(tmp_path, "test") == state.TrackerState("new-id", {"train": 10})
    # Resumed: the same run id, what it missed first, then the new records.
    again = Sink()
    worker = Worker(again, tmp_path, state.read(tmp_path, "test"),
                    missed=lambda sent: recs("val", 10) if sent == {"train": 10} else [])
    worker.send(recs("train", 15))
    assert worker.close(5.0)
    assert steps_of(again.got) == [("val", 10), ("train", 15)]
    assert state.read(tmp_path, "test") == state.TrackerState("new-id", {"train": 15,
                                                                         "val": 10})
    # The tracker's store lost that run (a new id): it is owed everything from the start.
    fresh = Sink(lost=True)
    worker = Worker(fresh, tmp_path, state.TrackerState("lost-id", {"train": 15}),
                    missed=lambda sent: recs("train", 5, 10, 15) if not sent else [])
    assert worker.close(5.0)
    assert steps_of(fresh.got) == [("train", 5), ("train", 10), ("train", 15)]


class OpenRowSink(Sink):
    """A tracker that, as wandb does, holds the row of its last step until a later one."""

    def __init__(self) -> None:
        super().__init__()
        self.open_row: list[Record] = []

    def log(self, records: list[Record]) -> list[Record]:
        self.got += records
        held, self.open_row = settled(self.open_row, records)
        return held


def test_the_state_counts_only_what_the_tracker_holds_for_good(tmp_path: Path) -> None:
    assert steps_of(settled([], recs("train", 5, 10))[0]) == [("train", 5)]
    held, row = settled(recs("train", 10), [*recs("val", 10), *recs("train", 12)])
    assert steps_of(held) == [("train", 10), ("val", 10)] and steps_of(row) == [("train", 12)]
    assert settled([], []) == ([], [])
    sink = OpenRowSink()
    worker = Worker(sink, tmp_path, state.TrackerState())
    worker.send(recs("train", 5, 10))
    worker.send(recs("val", 10))
    deadline = time.monotonic() + 5
    while (len(sink.got) < 3 or not state.read(tmp_path, "test").sent) \
            and time.monotonic() < deadline:
        time.sleep(0.01)
    # A kill now loses step 10's open row: the state file says 5, and the resume sends 10
    # (the second batch, all at step 10, settles nothing more).
    assert len(sink.got) == 3 and state.read(tmp_path, "test").sent == {"train": 5}
    worker.finish(None, "preempted")
    assert worker.close(5.0)
    assert state.read(tmp_path, "test").sent == {"train": 10, "val": 10}


def test_a_failing_tracker_warns_once_and_takes_nothing_more(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "hpcdp")
    worker = Worker(Sink(fail_open=True), tmp_path, state.TrackerState())
    worker._thread.join(5.0)
    for _ in range(3):
        worker.send(recs("train", 5))
    assert worker.close(5.0)
    (only,) = warnings_of(caplog)
    assert "tracker test: failed" in only and "no route to the server" in only


def test_a_hanging_tracker_is_bounded(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "hpcdp")
    sink = Sink(block=True)
    worker = Worker(sink, tmp_path, state.TrackerState(), queue_size=2)
    t0 = time.monotonic()
    for step in range(1, 6):  # one taken (and hanging), two queued, two dropped
        worker.send(recs("train", step))
    assert time.monotonic() - t0 < 0.5  # sending never waits for the tracker
    assert not worker.close(0.3)
    assert time.monotonic() - t0 < 2.0
    (only,) = warnings_of(caplog)  # the dropped items warned; the timeout only at debug
    assert "later ones are dropped" in only
    sink.release.set()
