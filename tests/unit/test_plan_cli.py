"""`hpcdp plan` on run folders in the trainer's format: reading, refusing, the table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcdp.plan import cli, measure, model

ALLREDUCE = {"np": 2, "rows": [
    {"config": "mpi-hpcdp", "column": "hvd_", "bytes": n, "seconds_median": 2e-5 + n / 1e9}
    for n in (4096, 1 << 20, 16 << 20)]}


def write_run(run: Path, ranks: int, batch: int, step_ms: float, fixed: bool = True,
              layout: bool = True) -> Path:
    """A finished run as the trainer leaves it: summary.json, metrics.jsonl, config.toml."""
    run.mkdir(parents=True)
    gradients = {"tensor_bytes": [400_000, 600_000, 1_000_000], "bucket_bytes": 1_000_000,
                 "fusion_threshold": 1 << 20, "sparse": False}
    (run / "summary.json").write_text(json.dumps({
        "world_size": ranks, "global_batch": batch, "peak_lr": 0.1, "steps": 40,
        **({"gradients": gradients} if layout else {})}))
    (run / "config.toml").write_text("[data]\n" + (f"global_batch_size = {batch}\n"
                                                    if fixed else "batch_size = 32\n"))
    with (run / "metrics.jsonl").open("w") as f:
        for step in range(5, 45, 5):
            f.write(json.dumps({"kind": "train", "step": step, "step_ms": step_ms,
                                "data_ms": 1.0, "compute_ms": step_ms - 2.0, "comm_ms": 0.0,
                                "samples_per_s": batch * 1000 / step_ms}) + "\n")
    return run


def test_step_of_a_one_rank_run(tmp_path: Path) -> None:
    full = measure.read_run(write_run(tmp_path / "a", 1, 32, 21.0), 10)
    half = measure.read_run(write_run(tmp_path / "b", 1, 16, 13.0), 10)
    step = measure.step_of(full, 2 / 3, True, half=half)
    # compute = step - data: 20 and 12 ms -> fixed 2 * 12 - 20 = 4 ms.
    assert step.compute_s == pytest.approx(0.020) and step.fixed_s == pytest.approx(0.004)
    assert step.data_s == pytest.approx(0.001) and step.measured_batch == 32
    assert step.bucket_bytes == (1_000_000, 1_000_000)  # 1 MB flat buckets


def test_refusals(tmp_path: Path) -> None:
    two = measure.read_run(write_run(tmp_path / "two", 2, 64, 30.0), 10)
    with pytest.raises(measure.MeasureError, match="must be a 1-rank run"):
        measure.step_of(two, 2 / 3, True)
    old = measure.read_run(write_run(tmp_path / "old", 1, 32, 20.0, layout=False), 10)
    with pytest.raises(measure.MeasureError, match="no gradient layout"):
        measure.step_of(old, 2 / 3, True)
    with pytest.raises(measure.MeasureError, match="missing"):
        measure.read_run(tmp_path / "none", 10)
    bad = write_run(tmp_path / "bad", 1, 32, 20.0)
    with (bad / "metrics.jsonl").open("a") as f:
        f.write("{not json\n")
    with pytest.raises(measure.MeasureError, match=r"metrics.jsonl:9"):
        measure.read_run(bad, 10)


def test_plan_table_and_suggestion(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = write_run(tmp_path / "run", 1, 32, 21.0)
    (tmp_path / "ar.json").write_text(json.dumps(ALLREDUCE))
    out = tmp_path / "plan.json"
    assert cli.main(["--run", str(run), "--allreduce", str(tmp_path / "ar.json"),
                     "--max-nodes", "4", "--target", "0.5", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "global batch of 32, 1 rank(s) per node" in text
    assert "alpha 10.0 us, 1.00 GB/s" in text  # p=2: 2e-5 s = 2 alpha, 1e-9 s/B = beta
    saved = json.loads(out.read_text())
    preds = saved["predictions"]
    assert [p["nodes"] for p in preds] == [1, 2, 3, 4]
    assert [p["fits_batch"] for p in preds] == [True, True, False, True]
    assert preds[0]["step_s"] == pytest.approx(0.021)
    # By hand, 2 nodes: data 0.5, compute 10 ms (backward 6.67); buckets of 1 MB ready at
    # 3.33 and 6.67 ms, each 2*10us + 1e6 B * 1e-9 s/B = 1.02 ms: the last ends 1.02 ms
    # after backward.
    assert preds[1]["exposed_s"] == pytest.approx(1.02e-3)
    assert preds[1]["step_s"] == pytest.approx(0.0005 + 0.010 + 0.00102)
    assert saved["suggested_nodes"] == list(model.suggested_range(
        [model.Prediction(**{**p, "notes": ()}) for p in preds], 0.5))


def test_per_rank_batch_needs_a_global_batch(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    run = write_run(tmp_path / "run", 1, 32, 21.0, fixed=False)
    (tmp_path / "ar.json").write_text(json.dumps(ALLREDUCE))
    assert cli.main(["--run", str(run), "--allreduce", str(tmp_path / "ar.json")]) == 2
    assert "per-rank batch: pass --global-batch" in capsys.readouterr().err
    assert cli.main(["--run", str(run), "--allreduce", str(tmp_path / "ar.json"),
                     "--global-batch", "64"]) == 0


def test_check_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ref = write_run(tmp_path / "ref", 1, 32, 21.0)
    two = write_run(tmp_path / "two", 2, 64, 25.0)
    (tmp_path / "ar.json").write_text(json.dumps(ALLREDUCE))
    assert cli.main(["--check", "--run", str(ref), "--against", f"{two}:1", "--label", "x",
                     "--allreduce", str(tmp_path / "ar.json")]) == 0
    text = capsys.readouterr().out
    # 2 ranks on 1 node at 64: data 1, compute 20, exposed 1.02 -> 22.02 against 25: -12%.
    assert "22.02" in text and "-12%" in text


def test_no_network_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = write_run(tmp_path / "run", 1, 32, 21.0)
    assert cli.main(["--run", str(run)]) == 2
    assert "no network model" in capsys.readouterr().err


@pytest.mark.parametrize("extra", [["--target", "0"], ["--target", "1.5"],
                                   ["--max-nodes", "0"], ["--ranks-per-node", "0"]])
def test_bad_options(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                     extra: list[str]) -> None:
    run = write_run(tmp_path / "run", 1, 32, 21.0)
    assert cli.main(["--run", str(run), *extra]) == 2
    assert "--target must be within" in capsys.readouterr().err
