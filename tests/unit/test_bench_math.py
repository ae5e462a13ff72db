"""The benchmarks' pure parts: sizes, bandwidth math, iteration counts, tables, configurations."""

from __future__ import annotations

import json
import math

import pytest

from hpcdp.bench import allreduce, common, fusion
from hpcdp.bench.common import RunConfig
from hpcdp.runtime import hvd_settings, thread_plan
from hpcdp.runtime.hvd_settings import CPU_BUCKET_BYTES


@pytest.mark.parametrize(
    ("text", "nbytes"),
    [("4KiB", 4096), ("4k", 4096), ("64MiB", 64 * 2**20), ("1GiB", 2**30), ("10MB", 10**7),
     ("4096", 4096), (" 256 MiB ", 256 * 2**20), ("1.5KiB", 1536)],
)
def test_parse_size(text: str, nbytes: int) -> None:
    assert common.parse_size(text) == nbytes


@pytest.mark.parametrize("text", ["", "KiB", "4 parsecs", "-4KiB", "0", "0.5"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="size|unit"):
        common.parse_size(text)


def test_parse_sizes_range_and_list() -> None:
    assert common.parse_sizes("4KiB..256MiB") == [4 * 4**i * 1024 for i in range(9)]
    assert common.parse_sizes("4KiB..16KiB", factor=2) == [4096, 8192, 16384]
    assert common.parse_sizes("64MiB,4KiB,4KiB") == [4096, 64 * 2**20]
    with pytest.raises(ValueError, match="backwards"):
        common.parse_sizes("1MiB..4KiB")
    with pytest.raises(ValueError, match="no sizes"):
        common.parse_sizes(",")


def test_format_size() -> None:
    assert common.format_size(4096) == "4 KiB"
    assert common.format_size(256 * 2**20) == "256 MiB"
    assert common.format_size(1536) == "1.5 KiB"
    assert common.format_size(100) == "100 B"


def test_bandwidths_follow_nccl_tests() -> None:
    # 64 MiB in 32 ms: algbw = bytes / time in 1e9 B/s.
    alg = common.algbw(64 * 2**20, 0.032)
    assert alg == pytest.approx(2.097152)
    assert common.allreduce_busbw(alg, 2) == pytest.approx(alg)  # 2(n-1)/n = 1 at n = 2
    assert common.allreduce_busbw(alg, 4) == pytest.approx(alg * 1.5)
    assert common.allreduce_busbw(alg, 8) == pytest.approx(alg * 1.75)
    assert common.allreduce_busbw(alg, 1) == 0.0
    with pytest.raises(ValueError):
        common.algbw(10, 0.0)
    with pytest.raises(ValueError):
        common.allreduce_busbw(1.0, 0)


def test_median_is_robust_to_one_slow_repeat() -> None:
    assert common.median([1.0, 1.1, 0.9, 50.0, 1.05]) == 1.05
    with pytest.raises(ValueError):
        common.median([])


def test_iters_for_is_bounded_and_decreasing() -> None:
    budget = 128 * 2**20
    counts = [allreduce.iters_for(s, budget) for s in common.parse_sizes("4KiB..256MiB")]
    assert counts[0] == 50 and counts[-1] == 1
    assert counts == sorted(counts, reverse=True)
    assert allreduce.iters_for(64 * 2**20, budget) == 2
    with pytest.raises(ValueError):
        allreduce.iters_for(0, budget)


def test_format_table_aligns_and_formats() -> None:
    text = common.format_table(["size", "GB/s", "ratio"],
                               [["4 KiB", 0.012345, None], ["256 MiB", 2.5, 1234.5]])
    lines = text.splitlines()
    assert lines[0].split() == ["size", "GB/s", "ratio"]
    assert set(lines[1].replace(" ", "")) == {"-"}
    assert lines[2].split() == ["4", "KiB", "0.0123", "-"]
    assert lines[3].split() == ["256", "MiB", "2.5", "1234"]
    assert len({len(line) for line in lines[1:]}) == 1  # every row as wide as the rule
    with pytest.raises(ValueError, match="headers"):
        common.format_table(["a", "b"], [[1]])


def test_parse_config() -> None:
    base = {"mpi-hpcdp": RunConfig("mpi-hpcdp", "mpirun", {"A": "1", "B": "2"})}
    cfg = common.parse_config("cyc5=mpirun:HOROVOD_CYCLE_TIME=5,X=y", base)
    assert cfg == RunConfig("cyc5", "mpirun", {"HOROVOD_CYCLE_TIME": "5", "X": "y"})
    assert cfg.uses_mpi
    derived = common.parse_config("b3=mpi-hpcdp+B=3", base)
    assert derived.launcher == "mpirun" and dict(derived.env) == {"A": "1", "B": "3"}
    assert not common.parse_config("g=horovodrun-gloo", base).uses_mpi
    # A configuration's worker arguments travel to the ones derived from it.
    base["bk"] = RunConfig("bk", "mpirun", {"A": "1"}, ("--bucket-bytes", "64"))
    assert common.parse_config("bk2=bk+A=2", base).args == ("--bucket-bytes", "64")
    assert common.parse_config("plain=mpirun", base).args == ()
    for bad in ("noequals", "x=", "x=srun", "x=mpirun:NOVALUE", "x=nobase+A=1"):
        with pytest.raises(ValueError, match="configuration"):
            common.parse_config(bad, base)


def test_builtin_configs_differ_only_in_settings() -> None:
    cfgs = allreduce.builtin_configs()
    assert cfgs["mpi-default"].env == hvd_settings.default_env()
    assert cfgs["mpi-hpcdp"].env == hvd_settings.recommended_env()
    assert {c.launcher for c in cfgs.values()} == {"mpirun", "horovodrun-gloo"}
    fcfg = fusion.builtin_configs("mpirun")
    assert fcfg["fusion-off"].env["HOROVOD_FUSION_THRESHOLD"] == "0"
    assert "HOROVOD_FUSION_THRESHOLD" not in fcfg["fusion-on"].env  # hpcdp's rule, at init
    # Buckets: training's CPU bucket size, the worker told so; only the 'on' settings.
    assert fcfg["buckets"].args == ("--bucket-bytes", str(CPU_BUCKET_BYTES))
    assert fcfg["buckets"].env == fcfg["fusion-on"].env and fcfg["fusion-on"].args == ()
    both = fusion.builtin_configs("mpirun", other=True)
    assert sorted(both) == ["buckets", "fusion-off", "fusion-on", "gloo-buckets",
                            "gloo-fusion-off", "gloo-fusion-on"]
    assert both["gloo-fusion-on"].launcher == "horovodrun-gloo"
    assert both["gloo-buckets"].launcher == "horovodrun-gloo"
    assert both["gloo-fusion-off"].env["HOROVOD_FUSION_THRESHOLD"] == "0"
    assert fusion.config_names("horovodrun-gloo") == (
        "gloo-fusion-off", "gloo-fusion-on", "gloo-buckets")


def test_what_fuses_each_configuration() -> None:
    assert fusion.fused_by(0, 0) == "nothing"
    assert fusion.fused_by(1 << 20, 0) == "Horovod 1 MiB"
    assert fusion.fused_by(1 << 20, 4 << 20) == "hpcdp buckets 4 MiB"


def test_settings_are_strings_and_overridable() -> None:
    env = hvd_settings.recommended_env({"HOROVOD_CYCLE_TIME": 2})
    assert env["HOROVOD_CYCLE_TIME"] == "2"
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())
    assert "HOROVOD_CYCLE_TIME" not in hvd_settings.recommended_env()  # not kept
    # Every Horovod default is replaced by a value chosen at init, or chosen per
    # process from its CPUs (thread_plan.plan_runtime).
    chosen_at_init = {"HOROVOD_FUSION_THRESHOLD", "HOROVOD_CYCLE_TIME"}
    by_cpus = {thread_plan.YIELD_VAR, "OMP_NUM_THREADS", "MKL_NUM_THREADS"}
    # The switches of the Gloo patches this Horovod build has (none on a stock build).
    by_build = set(hvd_settings.gloo_env({}, hvd_settings.horovod_patches()))
    assert set(hvd_settings.default_env()) <= chosen_at_init | by_cpus
    assert set(hvd_settings.recommended_env()) <= by_cpus | by_build


def test_fusion_threshold_by_device_and_backend() -> None:
    mib = 1024 * 1024
    assert hvd_settings.fusion_threshold_bytes(on_gpu=False, cpu_ops="mpi") == mib
    assert hvd_settings.fusion_threshold_bytes(on_gpu=False, cpu_ops="gloo") == 128 * mib
    assert hvd_settings.fusion_threshold_bytes(on_gpu=True, cpu_ops="mpi") == 128 * mib
    # What horovodrun --gloo sets, what a user sets, and nothing (mpirun).
    gloo_run = {"HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo"}
    assert hvd_settings.cpu_operations(gloo_run) == "gloo"
    assert hvd_settings.cpu_operations({"HOROVOD_CONTROLLER": "gloo"}) == "gloo"
    assert hvd_settings.cpu_operations({"HOROVOD_CONTROLLER": "gloo",
                                        "HOROVOD_CPU_OPERATIONS": "MPI"}) == "mpi"
    assert hvd_settings.cpu_operations({}) == "mpi"
    assert hvd_settings.fusion_env({}, on_gpu=False) == {"HOROVOD_FUSION_THRESHOLD": str(mib)}
    assert hvd_settings.fusion_env(gloo_run, on_gpu=False) == {
        "HOROVOD_FUSION_THRESHOLD": str(128 * mib)}
    assert hvd_settings.fusion_env({}, on_gpu=True) == {
        "HOROVOD_FUSION_THRESHOLD": str(128 * mib)}
    # A threshold already in the environment (the user's, or fusion off) is kept.
    assert hvd_settings.fusion_env({"HOROVOD_FUSION_THRESHOLD": "0"}, on_gpu=False) == {}


def _raw(config: str) -> dict:
    rows = []
    for col, secs in (("memcpy", 0.004), ("mpi", 0.032), ("hvd", 0.064), ("hvd_", 0.032)):
        rows.append({"column": col, "bytes": 64 * 2**20, "iters": 2, "seconds": [secs] * 3})
    if config.startswith("gloo"):
        rows = [r for r in rows if r["column"] != "mpi"]
    return {"np": 2, "rows": rows}


def test_summarize_ratios_tables() -> None:
    mpi_cfg = RunConfig("mpi-hpcdp", "mpirun", {})
    gloo_cfg = RunConfig("gloo-hpcdp", "horovodrun-gloo", {})
    rows = allreduce.summarize(mpi_cfg, _raw("mpi")) + allreduce.summarize(gloo_cfg, _raw("gloo"))
    allreduce.add_ratios(rows, "mpi-hpcdp")
    by = {(r["config"], r["column"]): r for r in rows}
    assert by[("mpi-hpcdp", "mpi")]["busbw_GBps"] == pytest.approx(2.097152)
    assert by[("mpi-hpcdp", "hvd")]["vs_mpi"] == pytest.approx(0.5)
    assert by[("mpi-hpcdp", "hvd_")]["vs_mpi"] == pytest.approx(1.0)
    # Gloo has no MPI of its own: compared with the reference MPI launch.
    assert by[("gloo-hpcdp", "hvd")]["vs_mpi"] == pytest.approx(0.5)
    assert "vs_mpi" not in by[("mpi-hpcdp", "memcpy")]
    text = allreduce.tables(rows, 2)
    assert "[mpi-hpcdp] (mpirun)" in text and "[gloo-hpcdp] (horovodrun-gloo)" in text
    assert "hvd/mpi" in text and "x 1.00" in text
    json.dumps(rows)  # serializable as is


def test_fusion_summary_and_speedup() -> None:
    summary = fusion.summarize({"fusion-off": [0.04, 0.05, 0.06], "fusion-on": [0.01, 0.02]},
                               tensors=200, tensor_bytes=40 * 1024)
    assert summary["fusion-off"]["seconds_median"] == pytest.approx(0.05)
    assert summary["fusion-on"]["seconds_median"] == pytest.approx(0.015)
    assert fusion.speedup(summary, "fusion-off", "fusion-on") == pytest.approx(0.05 / 0.015)
    assert fusion.speedup(summary, "fusion-off", "missing") is None
    assert math.isclose(summary["fusion-on"]["algbw_GBps"], 200 * 40 * 1024 / 0.015 / 1e9)


def test_fusion_speedup_per_launch_pair() -> None:
    launches = {"fusion-off": [[0.08, 0.09, 0.1], [0.2]], "fusion-on": [[0.04, 0.05], [0.05]]}
    assert fusion.pair_speedups(launches, "fusion-off", "fusion-on") == pytest.approx(
        [0.09 / 0.045, 0.2 / 0.05])
    assert fusion.pair_speedups(launches, "fusion-off", "gloo-fusion-on") == []


def test_write_json_adds_metadata(tmp_path) -> None:
    path = common.write_json(tmp_path / "sub" / "r.json", {"benchmark": "x", "rows": [1]})
    data = common.read_json(path)
    assert data["benchmark"] == "x" and data["rows"] == [1]
    assert data["meta"]["cores"] >= 1 and data["meta"]["date"].endswith("+00:00")
    assert list(path.parent.iterdir()) == [path]  # no temporary file left behind
    with pytest.raises(FileNotFoundError, match="missing.json"):
        common.read_json(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ValueError, match="bad.json"):
        common.read_json(tmp_path / "bad.json")


def test_main_rejects_bad_options_before_launching(capsys) -> None:
    assert allreduce.main(["--sizes", "4 parsecs"]) == 2
    assert "4 parsecs" in capsys.readouterr().err
    assert allreduce.main(["--configs", "nope"]) == 2
    assert "nope" in capsys.readouterr().err
    assert allreduce.main(["--np", "1"]) == 2
    assert allreduce.main(["--sizes", "6"]) == 2
    assert "multiples of 4" in capsys.readouterr().err
    assert fusion.main(["--tensor-size", "3"]) == 2
    assert fusion.main(["--tensors", "0"]) == 2
    assert fusion.main(["--compute-between", "-1"]) == 2


def test_idle_cost_uses_the_slowest_rank() -> None:
    raw = {"compute": [{"solo": [1.0, 1.0, 9.0], "beside_hvd": [1.2, 1.2, 1.2]},
                       {"solo": [2.0, 2.0, 2.0], "beside_hvd": [3.0, 3.0, 0.1]}]}
    cost = allreduce.idle_cost(raw)
    assert cost == {"solo_s": 2.0, "beside_hvd_s": 3.0, "slowdown": 1.5}
    assert allreduce.idle_cost({"compute": []}) is None


def test_resolve_device() -> None:
    assert allreduce.resolve_device("auto", False) == "cpu"
    assert allreduce.resolve_device("auto", True) == "cuda"
    assert allreduce.resolve_device("cpu", True) == "cpu"
    with pytest.raises(ValueError, match="no CUDA device"):
        allreduce.resolve_device("cuda", False)
    with pytest.raises(ValueError, match="unknown device"):
        allreduce.resolve_device("tpu", True)

