"""hpcdp.session before Horovod starts: the script's arguments read as hpcdp's config, a
bad one refused with exit 2, an array task's overrides last. (Its ranks: tests/parallel/
test_own_loop.py and tests/slurm/test_slurm_own_loop.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcdp import session
from hpcdp.cluster import sweep


def test_arguments_are_hpcdps_config(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text("[run]\nseed = 7\n[checkpoint]\nevery_steps = 5\n")
    cfg = session.configure(["--config", str(config), "checkpoint.every_steps=9", "data.path=d",
                             f"run.dir={tmp_path / 'run'}"])
    assert (cfg.run.seed, cfg.checkpoint.every_steps) == (7, 9)
    assert cfg.checkpoint_dir == tmp_path / "run" / "checkpoints"


@pytest.mark.parametrize(("argv", "named"), [
    (["checkpoint.every_steps=often"], "checkpoint.every_steps"),
    (["chekpoint.keep=2"], "chekpoint"),
])
def test_a_bad_argument_exits_2_naming_it(argv: list[str], named: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        session.configure(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("hpcdp session: error:") and named in err


def test_a_bad_fault_spec_exits_2(monkeypatch: pytest.MonkeyPatch) -> None:
    from hpcdp.runtime import faults

    monkeypatch.setattr(faults, "_armed", None)
    monkeypatch.setenv("HPCDP_FAULT", "stall:rank=1")
    with pytest.raises(SystemExit) as e:
        session.configure([])
    assert e.value.code == 2
    monkeypatch.setattr(faults, "_armed", None)


def test_an_array_task_takes_its_own_set_last(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    record = {"tasks": [{"run_dir": str(tmp_path / "t0"), "overrides": {"run.seed": 3}},
                        {"run_dir": str(tmp_path / "t1"), "overrides": {"run.seed": 4}}]}
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps(record))
    monkeypatch.setenv(sweep.ENV, str(path))
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "1")
    cfg = session.configure(["run.seed=1", "run.dir=elsewhere", "data.path=d"])
    assert cfg.run.seed == 4 and cfg.run_dir == tmp_path / "t1"
