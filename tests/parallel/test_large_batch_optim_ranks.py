"""LARS and LAMB under real ranks: 2 ranks give the bits of 1 rank with twice the batch,
and a stop on a signal then a resume continues with the same bits (tests/parallel/
test_train.py's patterns, with warmup and polynomial decay)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from hpcdp.train import checkpoint_folder as ckfolder
from hpcdp.train import checkpoint_format as ckformat

pytestmark = pytest.mark.parallel

N_TRAIN, N_VAL = 480, 96
TRAIN = [sys.executable, "-m", "hpcdp.train"]
BOUND = 120.0
RUN_SETTINGS = ("log.every_steps=5", "checkpoint.every_steps=0", "run.epochs=1",
                "optim.lr_scaling=none", "optim.weight_decay=1e-3", "schedule.kind=polynomial",
                "schedule.warmup_epochs=0.3", "schedule.power=2", "data.virtual_shards=8")
SETTINGS = {"lars": ("optim.name=lars", "optim.lr=2.0", "optim.trust_coefficient=0.01"),
            "lamb": ("optim.name=lamb", "optim.lr=0.01")}


def final_state(run: Path) -> dict:
    found = ckfolder.find_latest(run / "checkpoints")
    assert found is not None, f"no checkpoint in {run}"
    return ckformat.decode(found.data, str(found.path))


def cut_and_resumed(args, ranks, data: Path, cut: Path, common: tuple[str, ...]) -> dict:
    """2 ranks stopped by a signal to rank 1 (checkpoint at step 5), then resumed to the end."""
    worker = [sys.executable, str(Path(__file__).parent / "workers" / "train_signal.py")]
    first = ranks(worker, *args(data, cut, *common), np=2, timeout=BOUND,
                  env={"HPCDP_TEST_SIGNAL_AT": "4"})
    assert "preempted at step 5" in first.output, first.describe()
    second = ranks(TRAIN, *args(data, cut, *common), np=2, timeout=BOUND)
    assert "step-00000005.pt" in second.output, second.describe()
    return final_state(cut)


def assert_same_state(a: dict, b: dict) -> None:
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    state_a, state_b = a["optimizers"][0]["state"], b["optimizers"][0]["state"]
    assert state_a and state_a.keys() == state_b.keys()
    for key, slots in state_a.items():
        for slot, value in slots.items():
            other = state_b[key][slot]
            assert torch.equal(value, other) if torch.is_tensor(value) else value == other, slot


#: The kernels' sums depend on the thread count on a CPU: each rank computes on one.
ONE_THREAD = {"OMP_NUM_THREADS": "1"}


@pytest.mark.parametrize("name", ["lars", "lamb"])
def test_two_ranks_train_as_one_and_resume_bitwise(args, ranks, data: Path, tmp_path: Path,
                                                   name: str) -> None:
    common = SETTINGS[name]
    two, one = tmp_path / "two", tmp_path / "one"
    ranks(TRAIN, *args(data, two, *common), np=2, timeout=BOUND, env=ONE_THREAD)
    # One rank reads the step's 32 rows at once and computes them as the 2 ranks do: two
    # micro-batches of 16, the same rows each (hpcdp.tasks.read_options), summed and halved.
    ranks(TRAIN, *args(data, one, *common, "horovod.backward_passes_per_step=2"), np=1,
          timeout=BOUND, env=ONE_THREAD)
    a, b = final_state(two), final_state(one)
    assert a["step"] == b["step"] == N_TRAIN // 32
    assert_same_state(a, b)
    assert_same_state(a, cut_and_resumed(args, ranks, data, tmp_path / "cut", common))
