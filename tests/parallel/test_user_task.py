"""A user's own task, in a file outside the repository, gets every guarantee of a built-in one.

The task (tests/user_tasks.py: its own network, loss and metric, built on the image task
with `dataclasses.replace`) lies in a temporary folder and is named by reference,
`task.name=<folder>/mytask.py:TASK`. One module-scoped set of tiny runs (1 epoch of 6
steps) is checked by the tests below: it trains on 2 ranks; stopped mid-epoch and
resumed on 2 ranks it equals the uninterrupted run bitwise; resumed on 1 rank with the
same global batch it trains every sample of the epoch once, in the same global batches;
`hpcdp eval` gives the run's last validation; the export, loaded in a process that never
imports Horovod, gives the checkpoint's logits bitwise, and `hpcdp predict` reads it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
import user_tasks
from PIL import Image

from hpcdp.export import predict
from hpcdp.export.command import export
from hpcdp.runtime.launcher import rank_environment
from hpcdp.train import checkpoint_folder as ckfolder
from hpcdp.train import checkpoint_format as ckformat
from hpcdp.train import trained

pytestmark = pytest.mark.parallel

N_TRAIN, N_VAL = 192, 48
TRAIN = [sys.executable, "-m", "hpcdp.train"]
EVAL = [sys.executable, "-m", "hpcdp.cli", "eval"]
BOUND = 120.0
# 32 samples a step on any world size: 6 steps in the epoch; the cut comes after step 3.
COMMON = ("data.global_batch_size=32", "data.val_batch_size=16", "log.tensorboard=false",
          "run.epochs=1", "log.trace_samples=true", "optim.momentum=0.9",
          "checkpoint.every_steps=0")


@pytest.fixture(scope="module")
def runs(module_ranks, module_data: Path, tmp_path_factory) -> dict[str, Path]:
    """The user's task file, and its runs: uninterrupted; cut at step 3 and resumed on 2
    ranks; the same cut resumed on 1 rank."""
    root = tmp_path_factory.mktemp("user")
    task = user_tasks.write(root / "own")
    ref = f"{task}:TASK"
    # The cut run names the task relative to its config file's folder: the same file.
    (root / "own" / "run.toml").write_text('[task]\nname = "mytask.py:TASK"\n')
    paths = {"task": task, "full": root / "full", "cut": root / "cut", "one": root / "one"}

    def train(run: Path, *extra: str, np: int = 2, config: Path | None = None) -> str:
        options = ("--config", str(config)) if config else ()
        return module_ranks(TRAIN, *options, f"data.path={module_data}", f"run.dir={run}",
                            *COMMON, *extra, np=np, timeout=BOUND).output

    train(paths["full"], f"task.name={ref}")
    train(paths["cut"], "run.stop_at_step=3", config=root / "own" / "run.toml")
    shutil.copytree(paths["cut"], paths["one"])  # the same checkpoint, resumed elsewhere
    assert "resumed from" in train(paths["cut"], config=root / "own" / "run.toml")
    assert "resumed from" in train(paths["one"], f"task.name={ref}", np=1)
    return paths


def final_state(run: Path) -> dict:
    found = ckfolder.find_latest(run / "checkpoints")
    assert found is not None, f"no checkpoint in {run}"
    return ckformat.decode(found.data, str(found.path))


def traces(run: Path) -> dict[tuple[int, int], list[str]]:
    """(epoch, step) -> the fingerprints of the samples all ranks trained on, sorted."""
    seen: dict[tuple[int, int], list[str]] = defaultdict(list)
    for f in (run / "trace").glob("rank-*.jsonl"):
        for line in f.read_text().splitlines():
            r = json.loads(line)
            seen[(r["epoch"], r["step"])] += r["ids"]
    return {k: sorted(v) for k, v in seen.items()}


def test_a_users_task_trains_and_resumes_bitwise_on_two_ranks(runs: dict[str, Path]) -> None:
    ref = f"{runs['task']}:TASK"
    summary = json.loads((runs["full"] / "summary.json").read_text())
    assert summary["steps"] == N_TRAIN // 32 and summary["world_size"] == 2
    assert 0.0 <= summary["val_top2"] <= 1.0  # the task's own metric, reduced over ranks
    assert f'name = "{ref}"' in (runs["cut"] / "config.toml").read_text()  # made absolute
    full, cut = final_state(runs["full"]), final_state(runs["cut"])
    assert full["task"] == cut["task"] == ref and full["sample_shape"] == [1, 8, 8]
    assert full["step"] == cut["step"] == N_TRAIN // 32
    assert full["model"].keys() == cut["model"].keys()
    for key, tensor in full["model"].items():
        assert torch.equal(tensor, cut["model"][key]), key
    for key, value in full["optimizers"][0]["state"].items():
        assert torch.equal(value["momentum_buffer"],
                           cut["optimizers"][0]["state"][key]["momentum_buffer"])


def test_resumed_on_one_rank_it_trains_every_sample_once(runs: dict[str, Path]) -> None:
    got, want = traces(runs["one"]), traces(runs["full"])
    assert sorted(got) == [(0, s) for s in range(N_TRAIN // 32)]
    assert got == want  # the same global batches, step by step, on 1 rank as on 2
    every = [i for ids in got.values() for i in ids]
    assert len(every) == len(set(every)) == N_TRAIN


def test_eval_export_load_and_predict_reproduce_the_run(ranks, runs: dict[str, Path],
                                                        module_data: Path,
                                                        tmp_path: Path) -> None:
    run = runs["full"]
    summary = json.loads((run / "summary.json").read_text())
    ranks(EVAL, "--run", str(run), "--out", str(tmp_path / "eval.json"), np=2, timeout=BOUND)
    result = json.loads((tmp_path / "eval.json").read_text())
    assert result["samples"] == summary["val_samples"] == N_VAL
    assert [result[k] for k in ("loss", "acc", "top2")] == [
        summary[f"val_{k}"] for k in ("loss", "acc", "top2")]
    exported = export(run, tmp_path / "exp")
    assert exported["model"]["builder"] == "task" and exported["input"]["kind"] == "image"
    with h5py.File(module_data / "val.h5", "r") as f:
        x = f["x"][:]
    (tmp_path / "x.npy").write_bytes(x.tobytes())
    # A fresh process: the export's builder imports the user's file; Horovod never loads.
    script = ("import sys, numpy as np, torch\n"
              "from hpcdp.export import load\n"
              "net, config = load(sys.argv[1])\n"
              "s = config['input']\n"
              "x = np.frombuffer(open(sys.argv[2], 'rb').read(), np.uint8)\n"
              "x = torch.from_numpy(x.reshape(-1, 1, 8, 8).copy()).float() / s['scale']\n"
              "with torch.no_grad():\n"
              "    out = net((x - s['mean']) / s['std'])\n"
              "open(sys.argv[3], 'wb').write(out.numpy().tobytes())\n"
              "assert 'horovod' not in sys.modules, 'horovod was imported'\n")
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "exp"),
                           str(tmp_path / "x.npy"), str(tmp_path / "logits")],
                          capture_output=True, text=True, timeout=BOUND, env=rank_environment())
    assert done.returncode == 0, done.stderr
    model = trained.load(run).model
    with torch.no_grad():
        want = model(torch.from_numpy(x).float() / 255.0).numpy()
    assert (tmp_path / "logits").read_bytes() == want.tobytes()
    # hpcdp predict reads the export as an image model: the top class is the logits' argmax.
    Image.fromarray(x[0, 0]).save(tmp_path / "first.png")
    net, config = predict.load(tmp_path / "exp")
    (top,) = predict.predict(net, config, [tmp_path / "first.png"], top=1)
    assert top["top"][0]["class"] == int(np.argmax(want[0]))


def test_a_resume_under_another_reference_is_refused(ranks, runs: dict[str, Path],
                                                     module_data: Path, tmp_path: Path) -> None:
    moved = user_tasks.write(tmp_path / "elsewhere")
    run = runs["full"]
    before = sorted(p.name for p in (run / "checkpoints").iterdir())
    out = ranks(TRAIN, f"task.name={moved}:TASK", f"data.path={module_data}",
                f"run.dir={run}", *COMMON, "run.epochs=2", np=1, timeout=BOUND,
                expect_ok=False)
    assert out.returncode == 2, out.describe()
    assert (f"was written for task '{runs['task']}:TASK', but this run is task "
            f"'{moved}:TASK'") in out.output
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == before
