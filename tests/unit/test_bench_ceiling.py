"""The pure parts of `hpcdp bench train --mode ceiling`: order, ratios, verdicts."""

from __future__ import annotations

import pytest

from hpcdp.bench import ceiling, targets


def test_rounds_rotate_the_order() -> None:
    configs = ["ceiling", "horovodrun", "horovodrun-gloo", "mpirun"]
    orders = [ceiling.round_order(configs, r) for r in range(4)]
    assert orders[1] == ["horovodrun", "horovodrun-gloo", "mpirun", "ceiling"]
    assert {o[0] for o in orders} == set(configs)  # each goes first once
    assert ceiling.round_order(configs, 4) == configs


def _run(rnd: int, config: str, rate: float, model: str = "resnet18") -> dict:
    return {"round": rnd, "model": model, "config": config, "samples_per_s": rate,
            "settings": f"threads 1 ({config})"}


def test_each_launcher_over_the_ceiling() -> None:
    runs = [_run(0, "ceiling", 300.0), _run(0, "mpirun", 285.0), _run(0, "horovodrun", 200.0),
            _run(1, "ceiling", 200.0), _run(1, "mpirun", 196.0), _run(1, "horovodrun", 190.0),
            _run(0, "ceiling", 1000.0, "digits_cnn"), _run(0, "mpirun", 790.0, "digits_cnn")]
    s = ceiling.summarize(runs)
    assert s["resnet18"]["ceiling_samples_per_s"] == pytest.approx(250.0)
    mpi = s["resnet18"]["launchers"]["mpirun"]
    assert mpi["vs_ceiling"] == pytest.approx(240.5 / 250.0)
    assert mpi["vs_ceiling_per_round"] == pytest.approx([0.95, 0.98])
    assert mpi["settings"] == "threads 1 (mpirun)"
    verdict = ceiling.checks(s)
    assert verdict == {"resnet18 mpirun >= 0.95x ceiling": True,
                       "resnet18 horovodrun >= 0.95x ceiling": False,
                       "digits_cnn mpirun >= 0.80x ceiling": False}
    assert "x ceiling" in ceiling.table(s) and "0.96" in ceiling.table(s)
    rows = targets("train", {"summary": {**s, "checks": verdict}})
    assert ("resnet18: plain mpirun >= 0.95x ceiling", "0.96x", True) in rows
    with pytest.raises(ValueError, match="no ceiling"):
        ceiling.summarize([_run(0, "mpirun", 1.0)])


def test_launchers_argument() -> None:
    assert ceiling.launchers_arg("mpirun, horovodrun-gloo") == ["mpirun", "horovodrun-gloo"]
    for bad in ("srun", ""):
        with pytest.raises(ValueError, match="--launchers"):
            ceiling.launchers_arg(bad)


def test_ceiling_processes_get_the_rule_for_all_of_them() -> None:
    env = ceiling.ceiling_env(2, {"OMP_NUM_THREADS": "7", "PATH": "/bin"})
    assert env["PATH"] == "/bin" and env["OMP_NUM_THREADS"] != "7"
    assert int(env["OMP_NUM_THREADS"]) >= 1


def test_the_ceiling_binds_each_process_as_a_rank_would_be() -> None:
    from hpcdp.runtime.cpus import CpuView

    whole = CpuView(frozenset(range(8)), frozenset(range(8)))
    assert ceiling.ceiling_cpus(2, whole) == [frozenset(range(4)), frozenset(range(4, 8))]
    one = CpuView(frozenset({3}), frozenset(range(8)))  # fewer CPUs than processes
    assert ceiling.ceiling_cpus(2, one) == [None, None]
