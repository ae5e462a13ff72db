"""`hpcdp bench train`'s setups, the click model's bytes and table, the GPT-2 shape's data."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from hpcdp.bench import targets, train_lm, train_recsys
from hpcdp.bench.train import checks, lm_lines, parse_args, summarize, window_mean
from hpcdp.bench.train_setups import setups, train_overrides

MIB = 2**20


def _args(**kw) -> argparse.Namespace:
    base = parse_args(["--steps", "4", "--warmup", "2", "--window", "2"])
    for k, v in kw.items():
        setattr(base, k, v)
    return base


def test_dlrm_stands_for_each_table_size_under_each_mode() -> None:
    found = setups(["dlrm"], _args())
    assert [s.label for s in found] == ["dlrm_small_sparse", "dlrm_small_dense",
                                        "dlrm_large_sparse", "dlrm_large_dense"]
    assert [s.data for s in found] == ["dlrm_small"] * 2 + ["dlrm_large"] * 2
    assert {s.batch for s in found} == {256} and not any(s.has_ddp or s.has_bare for s in found)
    assert "horovod.sparse_grads=dense" in found[1].overrides
    assert [s.label for s in setups(["dlrm"], _args(tables=["large"]))] == [
        "dlrm_large_sparse", "dlrm_large_dense"]


def test_each_model_has_its_batch_unless_one_is_given() -> None:
    by_label = {s.label: s for s in setups(["resnet18", "gpt", "gpt2_124m"], _args())}
    assert {k: s.batch for k, s in by_label.items()} == {"resnet18": 32, "gpt": 32,
                                                         "gpt2_124m": 1}
    assert by_label["gpt2_124m"].seq_len == 1024 and by_label["gpt"].seq_len == 64
    assert by_label["resnet18"].has_bare and by_label["gpt2_124m"].has_ddp
    assert {s.batch for s in setups(["dlrm", "gpt2_124m"], _args(batch=2))} == {2}
    with pytest.raises(SystemExit):
        parse_args(["--batch", "0"])
    with pytest.raises(SystemExit):
        parse_args(["--models", "dlrm", "--tables", "huge"])


def test_overrides_the_shape_then_the_users_last(tmp_path: Path) -> None:
    s = setups(["gpt2_124m"], _args())[0]
    argv = train_overrides(s, tmp_path, tmp_path / "run", _args(set=["lm.layers=1"]))
    for key in ("lm.layers=12", "lm.heads=12", "lm.width=768", "lm.seq_len=1024",
                "data.batch_size=1", "model.name=gpt"):
        assert key in argv, key
    assert argv[-1] == "lm.layers=1" and argv.index("lm.layers=12") < len(argv) - 1
    assert train_lm.ddp_args() == ["--layers=12", "--heads=12", "--width=768",
                                   "--seq-len=1024"]


def test_gpt2_corpus_holds_the_windows_asked_for(tmp_path: Path) -> None:
    from hpcdp.data.format import tokens as tk

    windows = train_lm.windows_needed(steps=5, batch=2, ranks=2)
    assert windows == 24
    train_lm.write_corpus(tmp_path, windows)
    info = tk.validate_tokens(tmp_path / "train.h5", seq_len=1024, global_batch=windows,
                              scan=True)
    assert info.vocab_size == 50257 and info.windows(1024) == windows
    assert tk.validate_tokens(tmp_path / "val.h5", seq_len=1024).windows(1024) == 2


def _rec(step: int, mib: float) -> dict:
    return {"kind": "train", "step": step, "table_mb": mib}


def test_window_mean_leaves_out_the_warmup_and_weights_by_steps() -> None:
    records = [_rec(10, 100.0), _rec(20, 1.0), _rec(40, 4.0), {"kind": "val", "step": 40}]
    assert window_mean(records, "table_mb", 10) == pytest.approx((10 * 1.0 + 20 * 4.0) / 30)
    with pytest.raises(ValueError, match="no training window with table_mb"):
        window_mean(records, "table_mb", 40)


def test_bytes_sent_by_one_rank_per_step() -> None:
    mlp = 100_000
    # dense: a ring all-reduce of the whole tables and the MLPs, 2 (W-1)/W of each.
    assert train_recsys.sent_mib("dense", 18.0, mlp, 2) == pytest.approx(18.0 + mlp / MIB)
    # sparse: the all-gather of every rank's rows, (W-1)/W of W payloads, and the MLPs.
    assert train_recsys.sent_mib("sparse", 0.5, mlp, 2) == pytest.approx(0.5 + mlp / MIB)
    assert train_recsys.sent_mib("sparse", 0.5, mlp, 4) == pytest.approx(
        0.75 * 4 * 0.5 + 1.5 * mlp / MIB)
    assert train_recsys.sent_mib("dense", 18.0, mlp, 1) == 0.0  # one rank sends nothing


def test_mlp_bytes_are_the_dlrm_gradients_outside_the_tables() -> None:
    # bottom 13 -> 64 -> 16, top (16 + 27 * 26 / 2) -> 64 -> 1, weights and biases
    params = (13 * 64 + 64) + (64 * 16 + 16) + (367 * 64 + 64) + (64 + 1)
    assert train_recsys.mlp_bytes_of(13, 26, 16, [64], [64]) == 4 * params


def _summary(rate: float, step_ms: float = 10.0) -> dict:
    return {"samples_per_s_1": rate / 2, "samples_per_s_2": rate, "efficiency": 1.0,
            "step_ms": step_ms, "comm_ms": 1.0}


def test_comparison_names_the_winner_per_table_size() -> None:
    summary = {"dlrm_small_sparse": _summary(900.0), "dlrm_small_dense": _summary(1000.0),
               "dlrm_large_sparse": _summary(3000.0), "dlrm_large_dense": _summary(1000.0)}
    payloads = {"dlrm_small_sparse": 0.05, "dlrm_small_dense": 0.07,
                "dlrm_large_sparse": 0.2, "dlrm_large_dense": 18.6}
    per_round = {"dlrm_small_sparse": {0: 900.0, 1: 950.0, 2: 10.0},
                 "dlrm_small_dense": {0: 1000.0, 1: 800.0},
                 "dlrm_large_sparse": {0: 3000.0}, "dlrm_large_dense": {0: 1000.0}}
    c = train_recsys.compare(summary, payloads, mlp_bytes=0, per_round=per_round)
    assert c["small"]["winner"] == "dense" and c["small"]["speedup"] == pytest.approx(1000 / 900)
    # Rounds measuring both modes only: dense faster in round 0, not in round 1.
    assert (c["small"]["rounds_won"], c["small"]["rounds"]) == (1, 2)
    assert c["large"]["winner"] == "sparse" and c["large"]["speedup"] == pytest.approx(3.0)
    assert c["large"]["modes"]["dense"]["sent_mib"] == pytest.approx(18.6)
    text = train_recsys.table(c)
    lines = text.splitlines()
    assert "sent MiB/step" in lines[0] and "wins by" in lines[0]
    assert lines[2].startswith("small sparse") and not lines[2].endswith("x")
    assert lines[3].startswith("small dense") and lines[3].endswith("1.11x (1/2 rounds)")
    assert lines[4].endswith("3.00x (1/1 rounds)") and "18.600" in lines[5]
    one = train_recsys.compare({"dlrm_large_dense": _summary(1.0)}, payloads, 0)
    assert "winner" not in one["large"] and "small" not in one  # one mode: no verdict
    assert train_recsys.table(train_recsys.compare(summary, payloads, 0)).splitlines()[
        3].endswith("1.11x")  # no rounds given: the medians' verdict alone


def _runs(label: str, data_ms: float, step_ms: float, data_ms_2: float | None = None
          ) -> list[dict]:
    data = {1: data_ms, 2: data_ms if data_ms_2 is None else data_ms_2}
    return [{"round": 0, "model": label, "np": np, "samples_per_s": 1.0 * np,
             "step_ms": step_ms, "data_ms": data[np], "compute_ms": step_ms - data[np],
             "comm_ms": 0.0} for np in (1, 2)]


def test_lm_data_share_on_one_and_two_ranks_against_two_percent() -> None:
    s = summarize(_runs("gpt2_124m", 10.0, 1000.0), [])
    assert s["gpt2_124m"]["data_share_1"] == pytest.approx(0.01)
    assert checks(s) == {"gpt2_124m data share < 2% (1 and 2 ranks)": True}
    slow = summarize(_runs("gpt2_124m", 30.0, 1000.0), [])
    assert checks(slow) == {"gpt2_124m data share < 2% (1 and 2 ranks)": False}
    one_slow = summarize(_runs("gpt2_124m", 30.0, 1000.0, data_ms_2=10.0), [])
    assert checks(one_slow) == {"gpt2_124m data share < 2% (1 and 2 ranks)": False}
    rows = targets("train", {"summary": slow})
    assert ("gpt2_124m: data share < 2%", "3.0%", False) in rows
    s = summarize(_runs("gpt2_124m", 10.0, 1000.0, data_ms_2=5.0), [])
    s["gpt2_124m"].update(tokens_per_s_1=1024.0, tokens_per_s_2=2048.0,
                          ddp_tokens_per_s_2=1900.0, seq_len=1024)
    (line,) = lm_lines(s)
    assert "tokens/s 1 rank 1024, 2 ranks 2048, DDP 2 ranks 1900" in line
    assert "1.000% on 1 rank, 0.500% on 2" in line
