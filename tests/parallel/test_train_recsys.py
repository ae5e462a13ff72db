"""The recsys task through the shared trainer on real ranks: both gradient modes, parity,
bitwise resume, and a bad click file refused on every rank.

Tiny click files (plain h5py, written here) keep each run to seconds: 3 fields with
tables of 20, 12 and 6 rows, 4 dense features, a label that follows the item id.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from test_train import assert_same_params, failing, final_state, on_every_rank

pytestmark = pytest.mark.parallel

TRAIN = [sys.executable, "-m", "hpcdp.train"]
SIZES = (20, 12, 6)
EMBED = 4
N_TRAIN, N_VAL, CHUNK = 512, 128, 32
BOUND = 120.0


def write_clicks(path: Path, n: int, seed: int) -> None:
    """A click file as datasets/clicks.py lays it out: one chunking for the three fields."""
    rng = np.random.default_rng(seed)
    ids = np.stack([rng.integers(0, s, n) for s in SIZES], 1).astype(np.int32)
    dense = rng.normal(size=(n, 4)).astype(np.float32)
    p = 1 / (1 + np.exp(-(1.5 * (ids[:, 1] < 5) + dense[:, 0] - 1.0)))
    label = (rng.random(n) < p).astype(np.uint8)
    with h5py.File(path, "w") as f:
        f.create_dataset("dense", data=dense, chunks=(CHUNK, 4))
        f.create_dataset("sparse", data=ids, chunks=(CHUNK, len(SIZES)))
        f.create_dataset("label", data=label, chunks=(CHUNK,))
        f.attrs["table_sizes"] = np.asarray(SIZES, np.int64)
        f.attrs["field_names"] = json.dumps(["user", "item", "side"])


@pytest.fixture
def clicks(tmp_path: Path) -> Path:
    d = tmp_path / "clicks"
    d.mkdir()
    write_clicks(d / "train.h5", N_TRAIN, 1)
    write_clicks(d / "val.h5", N_VAL, 2)
    return d


RUN_SETTINGS = (  # after the args fixture's SMALL_RUN; a later value of a key wins
    "task.name=recsys", "data.batch_size=32", "data.val_batch_size=32",
    "data.virtual_shards=8", f"recsys.embed_dim={EMBED}", "recsys.bottom=[8]",
    "recsys.top=[8]", "log.every_steps=4", "run.epochs=2", "optim.lr=0.01",
)


def records(run: Path, kind: str) -> list[dict]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def test_both_gradient_modes_train_alike_and_match_one_rank(args, ranks, clicks: Path,
                                                            tmp_path: Path) -> None:
    runs = {mode: tmp_path / mode for mode in ("sparse", "dense")}
    for mode, run in runs.items():
        ranks(TRAIN, *args(clicks, run, f"horovod.sparse_grads={mode}"), np=2, timeout=BOUND)
        summary = json.loads((run / "summary.json").read_text())
        assert summary["task"] == "recsys" and summary["world_size"] == 2
        assert summary["steps"] == 2 * N_TRAIN // 64
        assert 0.5 < summary["val_auc"] <= 1.0 and 0.0 < summary["val_logloss"] < 1.0
        assert summary["val_samples"] == N_VAL
    whole = sum(SIZES) * EMBED * 4 / 2**20  # the dense mode hands over every table, whole
    assert {r["table_mb"] for r in records(runs["dense"], "train")} == {whole}
    # The sparse mode hands over the rows looked up (values and an int64 index each):
    # fewer than every row per batch of 32 on tables of 38 rows, so less than all of them.
    every_row = sum(SIZES) * (EMBED * 4 + 8) / 2**20
    assert all(0 < r["table_mb"] < every_row for r in records(runs["sparse"], "train"))
    assert "auc" not in records(runs["sparse"], "train")[0]
    assert "table_mb" not in records(runs["sparse"], "val")[0]
    sparse, dense = final_state(runs["sparse"]), final_state(runs["dense"])
    assert len(sparse["optimizers"]) == 2 and sparse["optimizers"][0]["state"]
    assert_same_params(sparse, dense, exact=False, atol=1e-5)
    one = tmp_path / "one"  # 2 ranks x 32 == 1 rank x 64: the same updates
    ranks(TRAIN, *args(clicks, one, "data.batch_size=64"), np=1, timeout=BOUND)
    assert_same_params(sparse, final_state(one), exact=False, atol=1e-5)


def test_stopped_and_resumed_run_is_bitwise_identical(args, ranks, clicks: Path,
                                                      tmp_path: Path) -> None:
    full, cut = tmp_path / "full", tmp_path / "cut"
    ranks(TRAIN, *args(clicks, full), np=2, timeout=BOUND)
    first = ranks(TRAIN, *args(clicks, cut, "run.stop_at_step=5"), np=2, timeout=BOUND)
    assert "stopped at step 5" in first.output and not (cut / "summary.json").exists()
    second = ranks(TRAIN, *args(clicks, cut), np=2, timeout=BOUND)
    assert "resumed from" in second.output and "step-00000005.pt" in second.output
    a, b = final_state(full), final_state(cut)
    assert a["step"] == b["step"] == 2 * N_TRAIN // 64
    assert_same_params(a, b, exact=True)
    for opt_a, opt_b in zip(a["optimizers"], b["optimizers"], strict=True):
        for key, state in opt_a["state"].items():
            for name, value in state.items():
                assert torch.equal(torch.as_tensor(value),
                                   torch.as_tensor(opt_b["state"][key][name])), (key, name)
    assert (json.loads((full / "summary.json").read_text())["val_auc"]
            == json.loads((cut / "summary.json").read_text())["val_auc"])


def test_an_id_outside_its_table_is_refused_on_every_rank(args, ranks, clicks: Path,
                                                          tmp_path: Path) -> None:
    with h5py.File(clicks / "val.h5", "r+") as f:
        f["sparse"][70, 1] = SIZES[1]  # one past the item table's last row
    out = failing(ranks, [*TRAIN, *args(clicks, tmp_path / "r")])
    on_every_rank(out, "field 'item' (column 1 of 'sparse'): id 12 is outside its table of "
                       f"12 rows, in rows [0, {N_VAL}) of {clicks / 'val.h5'} (first at row 70)")
    assert not (tmp_path / "r").exists()
