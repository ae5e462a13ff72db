"""Device placement and Horovod environment rules (pure; no MPI, no GPU needed)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hpcdp.config import HorovodConfig
from hpcdp.runtime.dist import AgreedError, choose_device
from hpcdp.runtime.hvd_settings import horovod_env


def test_cpu_when_no_cuda() -> None:
    assert choose_device("auto", 3, False, 0, None) == torch.device("cpu")
    assert choose_device("cpu", 0, True, 4, None) == torch.device("cpu")


def test_one_gpu_per_local_rank() -> None:
    assert choose_device("auto", 2, True, 4, "0,1,2,3") == torch.device("cuda", 2)


def test_scheduler_narrowed_to_one_gpu_uses_device_zero() -> None:
    assert choose_device("cuda", 1, True, 1, "1") == torch.device("cuda", 0)


def test_too_few_gpus_and_no_gpu_errors() -> None:
    with pytest.raises(AgreedError, match="local rank 2 has no GPU"):
        choose_device("auto", 2, True, 2, "0,1")
    with pytest.raises(AgreedError, match="no CUDA device"):
        choose_device("cuda", 0, False, 0, None)


def test_horovod_env() -> None:
    mib = 1024 * 1024
    wake = {"HOROVOD_WAKE_ON_ENQUEUE": "1"}
    # Nothing configured: the fusion threshold follows the device and the backend, and
    # CPU training wakes Horovod's thread on enqueue...
    assert horovod_env(HorovodConfig(), Path("r")) == {"HOROVOD_FUSION_THRESHOLD": str(mib),
                                                       **wake}
    assert horovod_env(HorovodConfig(), Path("r"), on_gpu=True) == {
        "HOROVOD_FUSION_THRESHOLD": str(128 * mib)}
    assert horovod_env(HorovodConfig(), Path("r"), environ={"HOROVOD_CONTROLLER": "gloo"}) == {
        "HOROVOD_FUSION_THRESHOLD": str(128 * mib), **wake}
    # ...unless the environment already has them (left as they are).
    assert horovod_env(HorovodConfig(), Path("r"),
                       environ={"HOROVOD_FUSION_THRESHOLD": "5",
                                "HOROVOD_WAKE_ON_ENQUEUE": "0"}) == {}
    env = horovod_env(HorovodConfig(fusion_threshold_mb=2, cycle_time_ms=2.5,
                                    timeline="tl.json"), Path("r"),
                      environ={"HOROVOD_FUSION_THRESHOLD": "5"})  # the config wins
    assert env == {"HOROVOD_FUSION_THRESHOLD": str(2 * 1024 * 1024), **wake,
                   "HOROVOD_CYCLE_TIME": "2.5", "HOROVOD_TIMELINE": str(Path("r/tl.json"))}


def test_wake_text_and_patch_detection(tmp_path: Path) -> None:
    from hpcdp.runtime import hvd_settings

    patched, plain = tmp_path / "patched.so", tmp_path / "plain.so"
    patched.write_bytes(b"\0" * 4096 + b"HOROVOD_WAKE_ON_ENQUEUE\0" + b"\0" * 10)
    plain.write_bytes(b"\0" * 4096 + b"HOROVOD_CYCLE_TIME\0")
    assert hvd_settings.horovod_wakes(str(patched))
    assert not hvd_settings.horovod_wakes(str(plain))
    assert not hvd_settings.horovod_wakes(str(tmp_path / "missing.so"))
    gloo = tmp_path / "gloo.so"
    gloo.write_bytes(b"\0" * 4096 + b"hpcdp-gloo-pair-allreduce-2\0hpcdp-gloo-yield-when-busy-2\0")
    old = tmp_path / "recipe5.so"  # the marks of the builds before the switches
    old.write_bytes(b"\0" * 4096 + b"hpcdp-gloo-pair-allreduce\0hpcdp-gloo-yield-when-busy\0")
    assert hvd_settings.horovod_patches(str(old)) == frozenset()
    assert hvd_settings.horovod_patches(str(gloo)) == {"gloo-pair-allreduce",
                                                       "gloo-yield-when-busy"}
    assert hvd_settings.horovod_patches(str(patched)) == {"wake-on-enqueue"}
    assert hvd_settings.horovod_patches(str(plain)) == frozenset()
    on = {"HOROVOD_WAKE_ON_ENQUEUE": "1", "HOROVOD_CYCLE_TIME": "50"}
    assert hvd_settings.wake_text(on, True) == "wake on enqueue, cycle 50 ms"
    assert "50 ms slept out (Horovod without hpcdp's patch)" in hvd_settings.wake_text(on, False)
    assert hvd_settings.wake_text({"HOROVOD_WAKE_ON_ENQUEUE": "0"}, True) == (
        "cycle 1 ms slept out")
    assert hvd_settings.wake_text({}, True) == "cycle 1 ms slept out"


def test_the_cycle_is_long_only_where_an_enqueue_wakes_horovod() -> None:
    from hpcdp.runtime import hvd_settings

    on = {"HOROVOD_WAKE_ON_ENQUEUE": "1"}
    assert hvd_settings.cycle_env(on, patched=True) == {"HOROVOD_CYCLE_TIME": "50"}
    assert hvd_settings.cycle_env(on, patched=False) == {}  # each all-reduce would wait
    assert hvd_settings.cycle_env({"HOROVOD_WAKE_ON_ENQUEUE": "0"}, patched=True) == {}
    assert hvd_settings.cycle_env({**on, "HOROVOD_CYCLE_TIME": "3"}, patched=True) == {}
    # Through horovod_env: CPU training asks for the wake, GPUs do not, the config wins.
    assert horovod_env(HorovodConfig(), Path("r"), patched=True)["HOROVOD_CYCLE_TIME"] == "50"
    assert "HOROVOD_CYCLE_TIME" not in horovod_env(HorovodConfig(), Path("r"), on_gpu=True,
                                                   patched=True)
    assert "HOROVOD_CYCLE_TIME" not in horovod_env(HorovodConfig(), Path("r"))
    assert horovod_env(HorovodConfig(cycle_time_ms=4), Path("r"),
                       patched=True)["HOROVOD_CYCLE_TIME"] == "4"


def test_an_oversubscribed_rank_is_told(monkeypatch) -> None:
    from hpcdp.runtime import dist
    from hpcdp.runtime.thread_plan import RuntimePlan

    crowded = RuntimePlan(threads=2, threads_why="OMP_NUM_THREADS exported", yield_idle=True,
                          yield_why="", cpus=2.0, sharers=2, local_ranks=2)
    monkeypatch.setattr(dist, "_runtime", crowded)
    text = dist.oversubscription()
    assert text is not None and text.startswith("2 local rank(s) x 2 compute thread(s) share "
                                                 "2 CPU(s): oversubscribed")
    assert "OMP_NUM_THREADS exported" in text
    fitting = RuntimePlan(threads=1, threads_why="2 CPUs / 2 local ranks", yield_idle=True,
                          yield_why="", cpus=2.0, sharers=2, local_ranks=2)
    monkeypatch.setattr(dist, "_runtime", fitting)
    assert dist.oversubscription() is None
    monkeypatch.setattr(dist, "_runtime", None)
    assert dist.oversubscription() is None
