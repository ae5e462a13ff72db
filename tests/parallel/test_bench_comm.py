"""The communication benchmarks run end to end on 2 ranks under real launchers.

Tiny sizes and few iterations: these check the plumbing and the shape of the
results (every figure present, positive and finite), not speed targets.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from hpcdp.bench import allreduce, common, fusion
from hpcdp.bench import main as bench_main
from hpcdp.runtime.hvd_settings import CPU_BUCKET_BYTES

pytestmark = pytest.mark.parallel


def _positive(value: float) -> bool:
    return isinstance(value, float) and math.isfinite(value) and value > 0


def test_allreduce_mpi_and_gloo(tmp_path: Path, capsys) -> None:
    argv = ["allreduce", "--sizes", "4KiB,64KiB", "--iters", "3", "--repeats", "2",
            "--configs", "mpi-default,gloo-hpcdp", "--out", str(tmp_path), "--timeout", "150"]
    assert bench_main(argv) == 0
    printed = capsys.readouterr().out
    assert "[mpi-default] (mpirun)" in printed and "[gloo-hpcdp] (horovodrun-gloo)" in printed
    data = json.loads((tmp_path / "allreduce.json").read_text())
    assert (tmp_path / "allreduce.png").stat().st_size > 10_000
    assert data["benchmark"] == "allreduce" and data["np"] == 2
    assert data["meta"]["cores"] >= 1 and data["meta"]["horovod"]
    assert set(data["configs"]) == {"mpi-default", "gloo-hpcdp"}
    rows = data["rows"]
    got = {(r["config"], r["column"], r["bytes"]) for r in rows}
    cols = allreduce.DEFAULT_COLUMNS
    want = {("mpi-default", c, s) for c in cols for s in (4096, 65536)}
    want |= {("gloo-hpcdp", c, s) for c in cols if c not in allreduce.MPI_ONLY
             for s in (4096, 65536)}
    assert got == want
    for row in rows:
        assert len(row["seconds"]) == 2 and row["iters"] == 3
        assert all(_positive(t) for t in row["seconds"]), row
        assert _positive(row["algbw_GBps"]) and _positive(row["busbw_GBps"]), row
        if row["column"] in allreduce.HVD_COLUMNS:
            assert _positive(row["vs_mpi"]), row  # Gloo's is against mpi-default's raw MPI
    for config in ("mpi-default", "gloo-hpcdp"):
        assert data["configs"][config]["device"] == "cpu"
        idle = data["idle_compute"][config]
        assert _positive(idle["solo_s"]) and _positive(idle["beside_hvd_s"])
        assert idle["slowdown"] == pytest.approx(idle["beside_hvd_s"] / idle["solo_s"])


@pytest.mark.extended  # a benchmark's whole run: CI's second tier
def test_fusion_on_and_off(tmp_path: Path, capsys) -> None:
    argv = ["--tensors", "20", "--tensor-size", "4KiB", "--repeats", "3", "--warmup", "1",
            "--pairs", "1", "--out", str(tmp_path), "--timeout", "120"]
    assert fusion.main(argv) == 0
    printed = capsys.readouterr().out
    assert "fusion speedup (off / on)" in printed and "hpcdp buckets 64 MiB" in printed
    data = json.loads((tmp_path / "fusion.json").read_text())
    assert (tmp_path / "fusion.png").stat().st_size > 5_000
    assert data["params"]["tensors"] == 20 and data["params"]["tensor_bytes"] == 4096
    assert data["configs"]["fusion-off"]["env"]["HOROVOD_FUSION_THRESHOLD"] == "0"
    # 'On' took hpcdp's threshold at init: 1 MiB for CPU tensors through MPI, 128 MiB in Gloo.
    assert data["configs"]["fusion-off"]["fusion_threshold"] == 0
    assert data["configs"]["fusion-on"]["fusion_threshold"] == 1 << 20
    assert data["configs"]["gloo-fusion-on"]["fusion_threshold"] == 128 << 20
    assert set(data["results"]) == {"fusion-off", "fusion-on", "buckets", "gloo-fusion-off",
                                    "gloo-fusion-on", "gloo-buckets"} and data["device"] == "cpu"
    assert data["configs"]["gloo-fusion-on"]["launcher"] == "horovodrun-gloo"
    assert {run: len(v) for run, v in data["speedup_per_pair"].items()} == {
        "mpirun": 1, "horovodrun-gloo": 1}  # one launch pair each
    # The buckets rows ran through hpcdp.runtime.grad_buckets (whose worker checks the mean).
    assert data["configs"]["buckets"]["bucket_bytes"] == CPU_BUCKET_BYTES
    assert data["configs"]["fusion-on"]["bucket_bytes"] == 0
    assert set(data["speedup_buckets"]) == {"mpirun", "horovodrun-gloo"}
    assert all(_positive(g) for g in data["speedup_buckets"].values())
    for result in data["results"].values():
        assert len(result["seconds"]) == 3
        assert all(_positive(t) for t in result["seconds"])
        assert _positive(result["seconds_median"]) and _positive(result["algbw_GBps"])
    assert _positive(data["speedup"]) and _positive(data["speedup_other"])
    assert data["other_launcher"] == "horovodrun-gloo"


def test_failing_ranks_name_the_configuration(tmp_path: Path) -> None:
    config = common.RunConfig("broken", "mpirun", {})
    with pytest.raises(common.BenchError, match="'broken' failed") as err:
        common.run_worker("hpcdp.bench.no_such_module", config, [], tmp_path / "r.json",
                          timeout=60)
    assert "no_such_module" in str(err.value)
    assert not (tmp_path / "r.json").exists()
