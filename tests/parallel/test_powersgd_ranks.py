"""PowerSGD on 2 ranks: the same parameters on every rank after every step, the bytes it
reports, and a stop by signal mid-epoch resumed bitwise (residuals and Q included).

One uninterrupted run (module-scoped) serves both tests; the tiny CNN's kernels are
compressed (a low threshold), its biases go whole, and the warm-up covers 3 steps.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import torch

from hpcdp.runtime.powersgd import bytes_per_step
from hpcdp.train import checkpoint_folder as ckfolder
from hpcdp.train import checkpoint_format as ckformat

pytestmark = pytest.mark.parallel

N_TRAIN, N_VAL = 480, 96
TRAIN = [sys.executable, "-m", "hpcdp.train"]
WORKERS = Path(__file__).parent / "workers"
BOUND = 120.0
STEPS = 2 * (N_TRAIN // 32)

SETTINGS = (
    "data.batch_size=16", "data.val_batch_size=16", "log.tensorboard=false",
    "optim.lr=0.05", "optim.momentum=0.9", "log.every_steps=5", "checkpoint.every_steps=0",
    "run.epochs=2", "horovod.compression=powersgd", "horovod.powersgd_rank=2",
    "horovod.powersgd_warmup_steps=3", "horovod.powersgd_min_elements=16",
)


def settings(data: Path, run: Path) -> list[str]:
    return [f"data.path={data}", f"run.dir={run}", *SETTINGS]


@pytest.fixture(scope="module")
def full(module_ranks, module_data: Path, tmp_path_factory: pytest.TempPathFactory):
    """The uninterrupted run, each step checked for equal parameters on both ranks."""
    run = tmp_path_factory.mktemp("powersgd") / "full"
    out = module_ranks([sys.executable, str(WORKERS / "train_same_params.py"),
                        *settings(module_data, run)], np=2, timeout=BOUND).output
    return run, out


def final_state(run: Path) -> dict:
    found = ckfolder.find_latest(run / "checkpoints")
    assert found is not None, f"no checkpoint in {run}"
    return ckformat.decode(found.data, str(found.path))


def test_ranks_hold_the_same_parameters_after_every_step(full) -> None:
    run, out = full
    checked = [int(s) for s in re.findall(r"same-params step (\d+)", out)]
    assert checked == list(range(1, STEPS + 1))
    state = final_state(run)
    shapes = [tuple(t.shape) for k, t in state["model"].items()
              if t.is_floating_point() and "running" not in k]
    sent, whole = bytes_per_step(shapes, 2, 16)
    assert sent < whole / 4  # the kernels went as factors
    traffic = json.loads((run / "summary.json").read_text())["gradient_traffic"]
    assert (traffic["bytes_per_step"], traffic["uncompressed_bytes_per_step"]) == (sent, whole)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    handed = [r["grad_bytes_per_step"] for r in records if r["kind"] == "train"]
    # steps 1-5: 3 uncompressed and 2 compressed; afterwards compressed only
    assert handed[0] == pytest.approx((3 * whole + 2 * sent) / 5)
    assert set(handed[1:]) == {sent}
    assert f"grads {sent / 1e6:.3g} MB/step sent (uncompressed {whole / 1e6:.3g} MB)" in out
    # every rank kept a residual of its own: they differ, the Q factors do not
    ranks = state["compression"]
    assert len(ranks) == 2 and torch.equal(ranks[0][0]["q"], ranks[1][0]["q"])
    assert not torch.equal(ranks[0][0]["residuals"][0], ranks[1][0]["residuals"][0])


def test_signal_mid_epoch_then_resume_is_bitwise(full, ranks, module_data: Path,
                                                 tmp_path: Path) -> None:
    cut = tmp_path / "cut"
    first = ranks([sys.executable, str(WORKERS / "train_signal.py"),
                   *settings(module_data, cut)], np=2, timeout=BOUND,
                  env={"HPCDP_TEST_SIGNAL_AT": "7"})
    assert "preempted at step 8: checkpoint written to" in first.output
    second = ranks(TRAIN, *settings(module_data, cut), np=2, timeout=BOUND)
    assert "resumed from" in second.output and "step-00000008.pt" in second.output
    a, b = final_state(full[0]), final_state(cut)
    assert a["step"] == b["step"] == STEPS
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    for k, v in a["optimizers"][0]["state"].items():
        assert torch.equal(v["momentum_buffer"], b["optimizers"][0]["state"][k]["momentum_buffer"])
    for mine, theirs in zip(a["compression"], b["compression"], strict=True):
        assert mine[0]["steps"] == theirs[0]["steps"] == STEPS
        assert torch.equal(mine[0]["q"], theirs[0]["q"])
        for r, s in zip(mine[0]["residuals"], theirs[0]["residuals"], strict=True):
            assert torch.equal(r, s)
