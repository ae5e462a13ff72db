"""`hpcdp bench train` end to end: real training runs on 1 and 2 ranks and the DDP reference.

Tiny settings (a narrow ResNet-18, few steps, one round): this checks the
plumbing and the shape of the results, not the speed targets.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from hpcdp.bench import main as bench_main

pytestmark = pytest.mark.parallel


def _positive(value: object) -> bool:
    return isinstance(value, float) and math.isfinite(value) and value > 0


@pytest.mark.extended  # a benchmark's whole run: CI's second tier
def test_bench_train_end_to_end(tmp_path: Path, capsys) -> None:
    argv = ["train", "--models", "digits_cnn,resnet18", "--steps", "4", "--warmup", "2",
            "--window", "2", "--rounds", "1", "--width", "4", "--samples", "512",
            "--timeout", "120", "--overhead-blocks", "2", "--out", str(tmp_path)]
    assert bench_main(argv) == 0
    printed = capsys.readouterr().out
    assert "hpcdp/DDP" in printed and "efficiency" in printed
    result = json.loads((tmp_path / "train.json").read_text())
    assert (tmp_path / "train.png").stat().st_size > 1000
    assert result["benchmark"] == "train" and "loadavg" in result["meta"]
    assert sorted((r["model"], r["np"]) for r in result["runs"]) == [
        ("digits_cnn", 1), ("digits_cnn", 2), ("resnet18", 1), ("resnet18", 2)]
    for run in result["runs"]:
        assert run["steps"] == 4  # the warm-up window left out
        for key in ("samples_per_s", "step_ms", "compute_ms", "comm_ms"):
            assert _positive(run[key]), (key, run)
        assert run["data_ms"] >= 0 and run["comm_ms"] < run["step_ms"]
    assert [d["world_size"] for d in result["ddp"]] == [2, 2]
    summary = result["summary"]
    for model in ("digits_cnn", "resnet18"):
        s = summary[model]
        for key in ("samples_per_s_1", "samples_per_s_2", "efficiency",
                    "ddp_samples_per_s_2", "vs_ddp"):
            assert _positive(s[key]), (model, key, s)
        assert len(s["efficiency_per_round"]) == 1 and _positive(s["efficiency_per_round"][0])
        assert set(s["shares"]) == {"data", "compute", "comm", "other"}
        assert all(0.0 <= v <= 1.0 for v in s["shares"].values()), s["shares"]
    assert set(summary["checks"]) == {"resnet18 data share < 5%",
                                      "resnet18 not slower than DDP (gloo)",
                                      "resnet18 1 rank within 2% of the bare loop (one process)"}
    assert sorted((b["model"], b["np"]) for b in result["bare"]) == [
        ("digits_cnn", 1), ("digits_cnn", 2), ("resnet18", 1), ("resnet18", 2)]
    for model in ("digits_cnn", "resnet18"):
        s = summary[model]
        for key in ("bare_samples_per_s_1", "bare_step_ms_1", "vs_bare_1", "vs_bare_2"):
            assert _positive(s[key]), (model, key, s)
        assert math.isfinite(s["overhead_ms_1"])
        inproc = s["in_process"]  # hpcdp.bench.step_overhead, run for this model
        assert inproc["label"] == model and inproc["blocks"] == 2, inproc
        for key in ("hpcdp_step_ms", "bare_step_ms", "bare_same_kernel_step_ms"):
            assert _positive(inproc[key]), (model, key, inproc)
        assert f"{model}: in one process, 2 alternating blocks" in printed
    assert "overhead ms" in printed and "hpcdp/bare 1" in printed


def test_bench_train_rejects_bad_options_before_running(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        bench_main(["train", "--models", "vgg", "--out", str(tmp_path)])
    with pytest.raises(SystemExit):
        bench_main(["train", "--steps", "5", "--window", "2", "--out", str(tmp_path)])
    assert not (tmp_path / "train.json").exists()


def test_bench_train_ceiling_end_to_end(tmp_path: Path, capsys) -> None:
    argv = ["train", "--mode", "ceiling", "--models", "digits_cnn", "--launchers", "mpirun",
            "--steps", "4", "--warmup", "2", "--window", "2", "--rounds", "1",
            "--timeout", "120", "--out", str(tmp_path), "--name", "ceil"]
    assert bench_main(argv) == 0
    printed = capsys.readouterr().out
    assert "x ceiling" in printed
    result = json.loads((tmp_path / "ceil.json").read_text())
    assert sorted(r["config"] for r in result["runs"]) == ["ceiling", "mpirun"]
    assert all(_positive(r["samples_per_s"]) for r in result["runs"])
    plain = next(r for r in result["runs"] if r["config"] == "mpirun")
    # Nothing exported: the training chose its own settings and said why.
    assert plain["settings"].startswith("threads ") and "exported" not in plain["settings"]
    s = result["summary"]["digits_cnn"]
    assert _positive(s["ceiling_samples_per_s"]) and _positive(
        s["launchers"]["mpirun"]["vs_ceiling"])
    assert set(result["summary"]["checks"]) == {"digits_cnn mpirun >= 0.80x ceiling"}


def test_step_overhead_in_one_process(tmp_path: Path) -> None:
    """hpcdp's step and the bare step, alternating in one process: one JSON line of figures."""
    import subprocess
    import sys

    from hpcdp.runtime.launcher import rank_environment

    data = tmp_path / "digits"
    prep = subprocess.run([sys.executable, "-m", "hpcdp.data.prep.cli", "digits",
                           "--out", str(data)],
                          capture_output=True, text=True, timeout=120, env=rank_environment())
    assert prep.returncode == 0, prep.stdout + prep.stderr
    done = subprocess.run(
        [sys.executable, "-m", "hpcdp.bench.step_overhead", "--config",
         str(Path(__file__).resolve().parents[2] / "hpcdp" / "configs" / "digits.toml"),
         f"data.path={data}", "--blocks", "2", "--steps", "3", "--warmup", "1",
         "log.every_steps=2"], capture_output=True, text=True, timeout=120,
        env=rank_environment(), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["label"] == "digits_cnn" and result["blocks"] == 2
    for key in ("hpcdp_step_ms", "bare_step_ms", "bare_same_kernel_step_ms"):
        assert _positive(result[key]), result
    assert math.isfinite(result["overhead_ms"]) and math.isfinite(result["own_overhead_ms"])
    assert _positive(result["last_window"]["compute_ms"])
