"""hpcdp.session under mpirun: a script's own loop keeps the global order when it resumes
on another number of ranks, and a checkpoint refuses extra state it cannot hold.

(Preemption, requeue, a bitwise resume and a stall under Slurm: tests/slurm/test_slurm_own_loop.py.)
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

from hpcdp.train import checkpoint_folder as ckfolder
from hpcdp.train import checkpoint_format as ckformat
from hpcdp.train import checkpoint_trust as cktrust

pytestmark = pytest.mark.parallel

N_TRAIN, N_VAL = 320, 32  # a global batch of 32: 10 steps an epoch, 2 epochs
BATCH = "data.global_batch_size=32"


def steps_seen(run_dir: Path) -> dict[int, list[int]]:
    """step -> the sorted ids every rank trained on at that step (all runs in the folder)."""
    seen: dict[int, list[int]] = defaultdict(list)
    for path in (run_dir / "ids").glob("rank-*.jsonl"):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            seen[record["step"]] += record["ids"]
    return {step: sorted(ids) for step, ids in seen.items()}


def test_resumed_on_one_rank_it_keeps_the_global_order(ranks, data: Path,
                                                       tmp_path: Path) -> None:
    common = [f"data.path={data}", BATCH, "checkpoint.every_steps=4"]
    ranks("own_loop_order", *common, f"run.dir={tmp_path / 'whole'}", np=2)
    cut = tmp_path / "cut"
    ranks("own_loop_order", *common, f"run.dir={cut}", "run.stop_at_step=13", np=2)
    assert [s for s, _ in ckfolder.list_checkpoints(cut / "checkpoints")][0] == 13  # mid-epoch 1
    resumed = ranks("own_loop_order", *common, f"run.dir={cut}", np=1)
    assert "resumed from" in resumed.output and "step 13, epoch 1, 1 rank(s)" in resumed.output
    whole, parts = steps_seen(tmp_path / "whole"), steps_seen(cut)
    assert sorted(whole) == list(range(20))
    assert parts == whole  # each step's global batch, the same samples, none twice
    for epoch in (range(10), range(10, 20)):  # every sample of each epoch once
        assert sorted(i for s in epoch for i in parts[s]) == list(range(N_TRAIN))
    final = ckfolder.list_checkpoints(cut / "checkpoints")[0][1]
    state = ckformat.decode(cktrust.read_verified(final), str(final))
    assert state["extra"] == {"seen": 20 * 32} and state["world_size"] == 1


def test_extra_state_a_checkpoint_cannot_hold_is_refused_naming_its_key(
        ranks, data: Path, tmp_path: Path) -> None:
    run = ranks("own_loop_order", f"data.path={data}", BATCH, "checkpoint.every_steps=3",
                f"run.dir={tmp_path / 'run'}", np=2, env={"OWN_LOOP_EXTRA": "bad"},
                expect_ok=False)
    assert run.returncode == 2, run.describe()
    assert "the session's extra state['lr_rule'] is a builtins.function" in run.output, \
        run.describe()
    assert not (tmp_path / "run" / "checkpoints" / "step-00000003.pt").exists()


def test_a_scripts_log_reaches_one_tracker_run_across_a_stop(ranks, data: Path,
                                                             tmp_path: Path) -> None:
    """session.log: metrics.jsonl and one MLflow run hold each even step once, with the
    same values, after a stop between two checkpoints and a resume."""
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    from hpcdp.train.reporting import read_jsonl

    run, env = tmp_path / "run", {"OWN_LOOP_LOG": "1", "MLFLOW_TRACKING_URI": ""}
    # A tracker's process runs at nice 19: on a machine busy with other tests its close
    # can pass the default bound, which test_tracking_process.py tests on its own.
    common = [f"data.path={data}", BATCH, "checkpoint.every_steps=4", f"run.dir={run}",
              'run.trackers=["mlflow"]', "run.tracker_close_timeout_s=120"]
    first = ranks("own_loop_order", *common, "run.stop_at_step=13", np=2, env=env)
    last = ranks("own_loop_order", *common, np=2, env=env)
    assert "resumed from" in last.output and "tracker" not in first.output + last.output
    records = read_jsonl(run / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(2, 21, 2))
    client = MlflowClient(tracking_uri=f"sqlite:///{run / 'trackers' / 'mlflow.db'}")
    (found,) = client.search_runs([client.get_experiment_by_name("hpcdp").experiment_id])
    assert found.info.status == "FINISHED" and found.data.metrics["summary/steps"] == 20
    got = [(m.step, m.value) for m in client.get_metric_history(found.info.run_id, "train/loss")]
    assert sorted(got) == [(r["step"], r["loss"]) for r in records]
