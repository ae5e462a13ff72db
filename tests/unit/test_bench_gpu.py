"""`hpcdp bench gpu`: its arithmetic, and the whole benchmark end to end at --tiny shapes
on the CPU (eager only here: compiled training is tested in tests/parallel/test_compile.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hpcdp.bench import common, gpu


def test_result_splits_the_step_and_counts_mfu() -> None:
    case = gpu.Case("gpt2_124m", "tokens", "hdf5", None, (), "tokens", 1024)
    # 10 steps of batch 32 in 2 s: data 0.1 s, compute 1.8 s, comm 0.1 s in all
    row = gpu.result(case, "default", 32, 10, np.array([0.1, 1.8, 0.1]), 2.0, 30.0,
                     flops=1e9, peak=989e12, memory=3 * 2**30)
    assert row["samples_per_s"] == pytest.approx(160.0)
    assert row["tokens_per_s"] == pytest.approx(160.0 * 1024)
    assert row["step_ms"] == pytest.approx(200.0)
    assert (row["data_ms"], row["compute_ms"], row["comm_ms"]) == pytest.approx((10, 180, 10))
    assert row["data_share"] == pytest.approx(0.05)
    assert row["mfu"] == pytest.approx(160.0 * 1e9 / 989e12)
    assert row["peak_memory_gib"] == pytest.approx(3.0)
    bare = gpu.result(case, "off", 32, 10, np.zeros(3), 2.0, 0.0, None, 989e12, None)
    assert bare["mfu"] is None and bare["peak_memory_gib"] is None and bare["data_share"] == 0


def test_full_shapes_are_the_issue_s() -> None:
    s = gpu.FULL
    assert (s.resnet, s.image_size, s.image_batch) == ("resnet50", 224, 256)
    assert (s.gpt_layers, s.gpt_heads, s.gpt_width, s.gpt_seq) == (12, 12, 768, 1024)
    labels = [(c.label, m) for c, m in gpu.cases(s, ["off", "default"])]
    assert len(labels) == 8 and ("resnet50_hdf5", "off") in labels
    assert ("gpt2_124m", "default") in labels and ("dlrm", "default") in labels


# Four cases built, FLOP-counted and timed in a child process: the suite's costliest unit
# test, for a GPU benchmark's plumbing (its arithmetic is tested above): CI's second tier.
@pytest.mark.extended
def test_tiny_benchmark_runs_end_to_end_on_cpu(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "hpcdp", "bench", "gpu", "--tiny", "--device", "cpu",
         "--compile", "off", "--warmup", "1", "--steps", "2", "--out", str(out)],
        capture_output=True, text=True, timeout=280, env=common.pythonpath_env())
    assert done.returncode == 0, done.stdout + done.stderr
    payload = json.loads((out / "gpu.json").read_text())
    rows = {r["case"]: r for r in payload["rows"]}
    assert set(rows) == {"resnet18_hdf5", "resnet18_memory", "gpt_tiny", "dlrm"}
    for r in rows.values():
        assert r["samples_per_s"] > 0 and r["compile"] == "off" and r["steps"] == 2
        assert 0 <= r["data_share"] < 1 and r["flops_per_sample"] > 0
        assert r["mfu"] is None  # no known peak for a CPU
    assert rows["gpt_tiny"]["tokens_per_s"] == pytest.approx(rows["gpt_tiny"]["samples_per_s"]
                                                             * gpu.TINY.gpt_seq)
    assert "data/compute/comm ms" in done.stdout


def test_no_gpu_is_a_clear_error(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    assert gpu.main(["--out", str(tmp_path)]) == 2
