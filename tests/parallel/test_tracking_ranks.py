"""Trackers on 2 ranks: a run stopped by SIGUSR1 after its first checkpoint, resumed,
killed between two checkpoints and resumed again leaves one MLflow run and one W&B run
(offline), read back with each library's own reader, holding every metric of
metrics.jsonl at its step once, with the values of the segment that kept it, and the
run's config;
a tracker whose server is unreachable warns once and the training finishes."""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpcdp.train.reporting import read_jsonl
from hpcdp.train.tracking import state
from hpcdp.train.tracking.records import flat_params

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on 3.10
    import tomli as tomllib

pytestmark = pytest.mark.parallel
mlflow = pytest.importorskip("mlflow")

N_TRAIN, N_VAL = 480, 96
TRAIN = [sys.executable, "-m", "hpcdp.train"]
SIGNAL = [sys.executable, str(Path(__file__).parent / "workers" / "train_signal.py")]
KILL = [sys.executable, str(Path(__file__).parent / "workers" / "train_tracked_kill.py")]
BOUND = 180.0
# 15 steps an epoch on 2 ranks of 16: records every 2 steps, checkpoints every 5.
RUN_SETTINGS = ("optim.lr=0.05", "log.every_steps=2", "checkpoint.every_steps=5",
                "run.epochs=2")


def tracker_env(tmp_path: Path) -> dict[str, str]:
    """The defaults under test (no tracking server, W&B offline); wandb's own caches in
    the test's folder."""
    return {"MLFLOW_TRACKING_URI": "", "WANDB_MODE": "offline",
            **{v: str(tmp_path / "wandb-home") for v in
               ("WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR")}}


def wandb_records(path: Path) -> Iterator[object]:
    """The records of a W&B offline run file (run-<id>.wandb), decoded with wandb's own
    protobuf: a 7-byte file header, then LevelDB-log framing (32 KiB blocks; each chunk a
    7-byte header of CRC, length and type: full, first, middle, last)."""
    from wandb.proto import wandb_internal_pb2

    data, block = path.read_bytes(), 32768
    assert data[:4] == b":W&B", f"{path} is no W&B run file"
    pos, parts = 7, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        body, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind in (1, 4):  # full, last
            record = wandb_internal_pb2.Record()
            record.ParseFromString(parts + body)
            parts = b""
            yield record
        elif kind in (2, 3):  # first, middle
            parts += body


def item_key(item: object) -> str:
    """A history item's name: wandb keeps "train/loss" as the nested key (train, loss)."""
    return item.key or "/".join(item.nested_key)


def wandb_history(run_files: list[Path]) -> tuple[set[str], list[tuple[int, dict]], dict]:
    """(run ids, [(step, values)] of every history row in file order, the config)."""
    ids, rows, config = set(), [], {}
    for f in run_files:
        for r in wandb_records(f):
            kind = r.WhichOneof("record_type")
            if kind == "run":
                ids.add(r.run.run_id)
                config.update({i.key: json.loads(i.value_json) for i in r.run.config.update})
            elif kind == "config":
                config.update({i.key: json.loads(i.value_json) for i in r.config.update})
            elif kind == "history":
                rows.append((r.history.step.num, {item_key(i): json.loads(i.value_json)
                                                  for i in r.history.item}))
    return ids, rows, config


def series(records: list[dict], kind: str) -> dict[str, list[tuple[int, float]]]:
    """metrics.jsonl as tracker names: "train/loss" -> [(step, value)] in step order."""
    out: dict[str, list[tuple[int, float]]] = {}
    for r in records:
        if r["kind"] != kind:
            continue
        for k, v in r.items():
            if k not in ("kind", "step", "time") and isinstance(v, (int, float)) \
                    and not isinstance(v, bool):
                out.setdefault(f"{kind}/{k}", []).append((r["step"], float(v)))
    return out


def check_mlflow(run: Path, records: list[dict], uri: str = "") -> None:
    """One MLflow run, FINISHED, holding each metric of `records` at its steps once, with
    their values, and the config as parameters; `uri`: the store (default: the run's)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri or f"sqlite:///{run / 'trackers' / 'mlflow.db'}")
    (found,) = client.search_runs([client.get_experiment_by_name("hpcdp").experiment_id])
    assert found.info.run_id == state.read(run, "mlflow").run_id
    assert found.info.status == "FINISHED"
    want = {**series(records, "train"), **series(records, "val")}
    assert {"train/loss", "train/step_ms", "val/acc"} <= set(want)
    for key, points in want.items():
        got = [(m.step, m.value) for m in client.get_metric_history(found.info.run_id, key)]
        assert sorted(got) == points, key  # the same steps, each once, the same values
    config = tomllib.loads((run / "config.toml").read_text())
    assert found.data.params == flat_params(config)
    assert found.data.metrics["summary/steps"] == 2 * (N_TRAIN // 32)


def check_wandb(run: Path, records: list[dict]) -> None:
    files = sorted((run / "trackers" / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) >= 2  # one per job segment (the killed one's if it got so far)
    ids, rows, config = wandb_history(files)
    assert ids == {state.read(run, "wandb").run_id}
    steps = [step for step, values in rows if "train/loss" in values]
    assert steps == sorted(set(steps))  # no step twice
    for key, points in {**series(records, "train"), **series(records, "val")}.items():
        assert [(s, float(v[key])) for s, v in rows if key in v] == points, key
    assert {k: v for k, v in config.items() if not k.startswith("_")} == \
        tomllib.loads((run / "config.toml").read_text())


def check_model(run: Path, tmp_path: Path) -> None:
    """The finished run's export, in the run folder, in the MLflow run's artifacts (byte
    for byte) and in the W&B run as a model artifact; the stopped segments logged none."""
    from mlflow.tracking import MlflowClient

    exported = sorted(p.name for p in (run / "model").iterdir())
    assert {"config.json", "model.safetensors"} <= set(exported)
    client = MlflowClient(tracking_uri=f"sqlite:///{run / 'trackers' / 'mlflow.db'}")
    run_id = state.read(run, "mlflow").run_id
    listed = sorted(Path(a.path).name for a in client.list_artifacts(run_id, "model"))
    assert listed == exported
    copy = Path(client.download_artifacts(run_id, "model", str(tmp_path / "got")))
    for name in exported:
        assert (copy / name).read_bytes() == (run / "model" / name).read_bytes(), name
    assert (run / "trackers" / "mlflow-artifacts").is_dir()  # in the run folder, not ./mlruns
    files = sorted((run / "trackers" / "wandb").glob("offline-run-*/run-*.wandb"))
    models = [r.artifact for f in files for r in wandb_records(f)
              if r.WhichOneof("record_type") == "artifact"]
    assert [(a.type, sorted(Path(e.path).name for e in a.manifest.contents)) for a in models] \
        == [("model", exported)]


def test_stop_kill_and_resumes_leave_one_tracker_run(args, ranks, data: Path,
                                                     tmp_path: Path) -> None:
    pytest.importorskip("wandb")
    run, env = tmp_path / "run", tracker_env(tmp_path)
    overrides = args(data, run, 'run.trackers=["mlflow", "wandb"]', "run.tracker_model=true")
    first = ranks(SIGNAL, *overrides, np=2, timeout=BOUND,
                  env={**env, "HPCDP_TEST_SIGNAL_AT": "7"})
    assert "preempted at step 8: checkpoint written to" in first.output
    ids = {name: state.read(run, name).run_id for name in ("mlflow", "wandb")}
    # Killed after step 12, with steps 10 and 12 in metrics.jsonl: the checkpoint of 10
    # covers 10, which MLflow has stored, and not 12, which the trackers hold back; wandb
    # has 10 only in its open row (wandb_run.settled), which the kill loses.
    killed = ranks(KILL, *overrides, np=2, timeout=BOUND, expect_ok=False,
                   env={**env, "HPCDP_TEST_KILL_AT": "12", "HPCDP_TEST_COVERED": "10",
                        "HPCDP_TEST_TRACKERS": "mlflow"})
    assert not killed.ok and "never took" not in killed.output
    assert [state.read(run, name).sent["train"] for name in ("mlflow", "wandb")] == [10, 8]
    last = ranks(TRAIN, *overrides, np=2, timeout=BOUND, env=env)
    assert "resumed from" in last.output and "step-00000010.pt" in last.output
    assert "tracker" not in first.output + last.output  # no tracker warned
    assert {name: state.read(run, name).run_id for name in ids} == ids
    records = read_jsonl(run / "metrics.jsonl")
    assert [r["step"] for r in records if r["kind"] == "train"] == list(range(2, 31, 2))
    check_mlflow(run, records)
    check_wandb(run, records)
    check_model(run, tmp_path)


@pytest.fixture
def mlflow_server(tmp_path: Path) -> Iterator[str]:
    """A real `mlflow server` on a loopback port, with its own SQLite store."""
    port = free_port()
    store = tmp_path / "server"
    store.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
         "--workers", "1", "--backend-store-uri", f"sqlite:///{store / 'mlflow.db'}",
         "--default-artifact-root", str(store / "artifacts")],
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, "mlflow server exited"
            try:
                urllib.request.urlopen(f"{uri}/health", timeout=2).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "mlflow server not up after 60 s"
                time.sleep(0.3)
        yield uri
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)


@pytest.mark.extended
def test_stop_and_resume_on_a_tracking_server(args, ranks, data: Path, tmp_path: Path,
                                              mlflow_server: str) -> None:
    run, env = tmp_path / "run", tracker_env(tmp_path)
    overrides = args(data, run, 'run.trackers=["mlflow"]', f"run.mlflow_uri={mlflow_server}")
    first = ranks(SIGNAL, *overrides, np=2, timeout=BOUND,
                  env={**env, "HPCDP_TEST_SIGNAL_AT": "7"})
    assert "preempted at step 8: checkpoint written to" in first.output
    last = ranks(TRAIN, *overrides, np=2, timeout=BOUND, env=env)
    assert "resumed from" in last.output and "tracker" not in first.output + last.output
    assert not (run / "trackers" / "mlflow.db").exists()
    check_mlflow(run, read_jsonl(run / "metrics.jsonl"), mlflow_server)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def dead_server(request: pytest.FixtureRequest) -> Iterator[str]:
    """A tracking URI whose server refuses (a closed port) or never answers (a socket
    that listens, so connections are made, and never reads)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        if request.param == "silent":
            s.listen(16)
            yield f"http://127.0.0.1:{port}"
            return
    yield f"http://127.0.0.1:{port}"


@pytest.mark.parametrize("dead_server", ["refusing", "silent"], indirect=True)
def test_dead_server_warns_once_and_training_finishes(args, ranks, data: Path, tmp_path: Path,
                                                      dead_server: str) -> None:
    run = tmp_path / "run"
    done = ranks(TRAIN, *args(data, run, 'run.trackers=["mlflow"]', "run.epochs=1",
                              f"run.mlflow_uri={dead_server}", "run.tracker_close_timeout_s=2"),
                 np=2, timeout=BOUND)
    warnings = [line for line in done.output.splitlines() if "WARNING" in line]
    assert len(warnings) == 1 and "tracker mlflow:" in warnings[0], done.output
    assert json.loads((run / "summary.json").read_text())["steps"] == N_TRAIN // 32
