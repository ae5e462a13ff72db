"""The guarantees of the training step on one rank, where the step takes shortcuts.

One rank trains with its optimizers unwrapped (no gradient hooks or synchronize)
and agrees on preemption without an all-reduce (hpcdp.train.setup.distributed,
hpcdp.train.loop.agree_stop). The NaN policy, the preemption schedule and exact
resume must hold as on several ranks (tests/parallel/test_train.py and
test_faults_parallel.py check them there).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from hpcdp.train import checkpoint_folder as ckfolder
from hpcdp.train import checkpoint_format as ckformat
from hpcdp.train import checkpoint_trust as cktrust

pytestmark = pytest.mark.parallel

TRAIN = [sys.executable, "-m", "hpcdp.train"]
SIGNAL = [sys.executable, str(Path(__file__).parent / "workers" / "train_signal_step.py")]
N_TRAIN, N_VAL = 160, 32
STEPS = N_TRAIN // 16  # batch 16, one rank, one epoch
BOUND = 120.0


RUN_SETTINGS = (  # after the args fixture's SMALL_RUN; a later value of a key wins
    "log.every_steps=2", "checkpoint.every_steps=2", "run.epochs=1", "optim.momentum=0.9",
)


def final_state(run: Path) -> dict:
    return ckformat.decode(cktrust.read_verified(ckfolder.step_path(run / "checkpoints", STEPS)),
                           "final")


def test_nan_stops_one_rank_without_saving(args, ranks, data: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    out = ranks(TRAIN, *args(data, run), np=1, timeout=BOUND, expect_ok=False,
                env={"HPCDP_FAULT": "nan:rank=0:step=3"})
    assert out.returncode != 0, out.describe()
    assert "step 3: non-finite (NaN/inf) loss or gradients; stopping without" in out.output
    assert [s for s, _ in ckfolder.list_checkpoints(run / "checkpoints")] == [2]


def test_nan_skip_on_one_rank_leaves_the_weights_as_they_were(args, ranks, data: Path,
                                                              tmp_path: Path) -> None:
    """The poisoned step (0-based 3, the 4th) applies nothing: the weights after it equal
    those before it, and training goes on to the end."""
    run = tmp_path / "run"
    out = ranks(TRAIN, *args(data, run, "run.on_nan=skip", "checkpoint.every_steps=1",
                             "checkpoint.keep=100"), np=1, timeout=BOUND,
                env={"HPCDP_FAULT": "nan:rank=0:step=3"}).output
    assert "step 3: non-finite loss or gradients on some rank; update skipped" in out

    def model(step: int) -> dict:
        path = ckfolder.step_path(run / "checkpoints", step)
        return ckformat.decode(cktrust.read_verified(path), f"step {step}")["model"]

    before, skipped, after = model(3), model(4), model(5)
    assert all(torch.equal(v, skipped[k]) for k, v in before.items())
    assert any(not torch.equal(v, after[k]) for k, v in skipped.items())
    assert json.loads((run / "summary.json").read_text())["steps"] == STEPS
    assert all(torch.isfinite(t).all() for t in final_state(run)["model"].values())


def test_one_rank_preemption_is_lagged_and_resumes_bitwise(args, ranks, data: Path,
                                                            tmp_path: Path) -> None:
    full, cut = tmp_path / "full", tmp_path / "cut"
    ranks(TRAIN, *args(data, full), np=1, timeout=BOUND)
    first = ranks(SIGNAL, *args(data, cut), np=1, timeout=BOUND,
                  env={"HPCDP_TEST_SIGNAL_BEFORE": "4"})
    # The flag is set during step 5 (0-based 4), sent with the check after it and
    # read at the next check, as on several ranks: the stop comes after step 6.
    assert "preempted at step 6: checkpoint written to" in first.output, first.output
    assert not (cut / "summary.json").exists()
    second = ranks(TRAIN, *args(data, cut), np=1, timeout=BOUND)
    assert "step-00000006.pt" in second.output
    a, b = final_state(full), final_state(cut)
    for k, v in a["model"].items():
        assert torch.equal(v, b["model"][k]), k
    for k, v in a["optimizers"][0]["state"].items():
        assert torch.equal(v["momentum_buffer"], b["optimizers"][0]["state"][k]["momentum_buffer"])
