"""Sweeps: reading override sets, checking them against the config, each task's pick,
collecting the results (pure logic and files; no Slurm)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from hpcdp import config as cfgmod
from hpcdp import tasks
from hpcdp.cluster import cli, sweep
from hpcdp.cluster.sweep import SweepError
from hpcdp.config import ConfigError

REPO = Path(__file__).resolve().parents[2]
DIGITS = str(REPO / "hpcdp" / "configs" / "digits.toml")


def build(path, overrides, environ):
    return cfgmod.build(path, list(overrides), tasks.defaults, environ=environ)


def write(tmp_path: Path, name: str, text: str) -> str:
    (tmp_path / name).write_text(text)
    return str(tmp_path / name)


def test_grid_options_are_every_combination_first_key_slowest() -> None:
    sets = sweep.grid_options(["optim.lr=0.05,0.1,0.2", "data.global_batch_size=32,64"])
    assert sets == [{"optim.lr": lr, "data.global_batch_size": b}
                    for lr in (0.05, 0.1, 0.2) for b in (32, 64)]
    # Values read as overrides do: TOML when they parse (lists keep their commas), else words.
    sets = sweep.grid_options(['optim.betas=[0.9,0.95],[0.8,0.9]', "optim.name=sgd,adamw",
                               'run.name="a,b",c'])
    assert sets[0] == {"optim.betas": [0.9, 0.95], "optim.name": "sgd", "run.name": "a,b"}
    assert len(sets) == 8 and sets[-1]["run.name"] == "c"


def test_toml_tasks_grid_and_csv(tmp_path: Path) -> None:
    toml = write(tmp_path, "s.toml", "[[task]]\noptim.lr = 0.1\n[[task]]\n"
                 "optim = { lr = 0.2, name = 'adamw' }\n")
    assert sweep.read_sets(toml, [])[0] == [{"optim.lr": 0.1},
                                            {"optim.lr": 0.2, "optim.name": "adamw"}]
    grid = write(tmp_path, "g.toml", "[grid]\noptim.lr = [0.1, 0.2]\nrun.seed = [1, 2]\n")
    assert len(sweep.read_sets(grid, [])[0]) == 4
    csv = write(tmp_path, "s.csv", "optim.lr,optim.name\n0.1,sgd\n0.2,adamw\n\n")
    assert sweep.read_sets(csv, [])[0] == [{"optim.lr": 0.1, "optim.name": "sgd"},
                                           {"optim.lr": 0.2, "optim.name": "adamw"}]


@pytest.mark.parametrize(("name", "text", "message"), [
    ("e.toml", "", "expected [[task]] tables (one override set each) or one [grid] table of "
                   "lists; found neither"),
    ("u.toml", "[[task]]\n[grid]\n[other]\n", "found both, and unknown: other"),
    ("e.toml", "[[task]]\n", "0 tasks"),
    ("z.toml", "task = []\n", "no override sets"),
    ("e.csv", "optim.lr\n", "no override sets"),
    ("b.csv", "optim.lr,run.seed\n0.1\n", "line 2: 1 values for 2 keys"),
    ("c.csv", "optim.lr,run.seed\n0.1, \n", "line 2: run.seed is empty"),
    ("d.csv", "optim.lr,optim.lr\n0.1,0.2\n", "appears twice"),
    ("k.csv", "lr\n0.1\n", "'lr' is not a config key"),
    ("g.toml", "[grid]\noptim.lr = []\n", "optim.lr needs a non-empty list"),
    ("g2.toml", "[grid]\noptim.lr = 0.1\n", "optim.lr needs a non-empty list"),
    ("t.toml", "[task]\noptim.lr = 0.1\n", "write [[task]]"),
    ("x.toml", "[[task]]\na.b.c = 1\n", "a.b is a table"),
    ("bad.toml", "[[task]\n", "not valid TOML"),
    ("s.yaml", "a: 1\n", "expected a .toml or .csv file"),
])
def test_bad_sweep_files_are_named(tmp_path: Path, name: str, text: str, message: str) -> None:
    path = write(tmp_path, name, text)
    if message == "0 tasks":  # an empty [[task]] table is a task with no overrides: fine
        assert sweep.read_sets(path, [])[0] == [{}]
        return
    with pytest.raises(SweepError, match=re.escape(message)) as err:
        sweep.read_sets(path, [])
    assert path in str(err.value)


def test_missing_file_and_grid_errors(tmp_path: Path) -> None:
    with pytest.raises(SweepError, match="does not exist"):
        sweep.read_sets(str(tmp_path / "nope.toml"), [])
    with pytest.raises(SweepError, match="not both"):
        sweep.read_sets(str(tmp_path / "x.toml"), ["optim.lr=1"])
    with pytest.raises(SweepError, match="expected key=value1"):
        sweep.grid_options(["optim.lr"])
    with pytest.raises(SweepError, match="given twice"):
        sweep.grid_options(["optim.lr=1", "optim.lr=2"])
    with pytest.raises(SweepError, match="needs --array FILE or --grid"):
        sweep.read_sets(None, [])


def check(tmp_path: Path, sets, overrides=(), config=DIGITS) -> None:
    sweep.check(sets, "s.toml", config, list(overrides), tmp_path / "sw", build)


def test_check_refuses_unknown_keys_bad_values_and_owned_keys(tmp_path: Path) -> None:
    check(tmp_path, [{"optim.lr": 0.1}, {"optim.lr": 0.2, "data.global_batch_size": 64}])
    with pytest.raises(SweepError, match=r"task 1 \(optim\.lrr=0\.2\).*unknown key "
                                         r"'optim\.lrr'.*did you mean 'optim\.lr'"):
        check(tmp_path, [{"optim.lr": 0.1}, {"optim.lrr": 0.2}])
    with pytest.raises(SweepError, match="task 0 .*optim.lr: expected float, got str"):
        check(tmp_path, [{"optim.lr": "fast"}])
    with pytest.raises(SweepError, match="task 0 .*optim.name"):
        check(tmp_path, [{"optim.name": "lion"}])
    with pytest.raises(SweepError, match="task 0 .*optim.lr"):
        check(tmp_path, [{"optim.lr": -1.0}])
    with pytest.raises(SweepError, match="run.dir is set by the sweep itself"):
        check(tmp_path, [{"run.dir": "x"}])
    with pytest.raises(SweepError, match="leave run.dir out"):
        check(tmp_path, [{"optim.lr": 0.1}], overrides=["run.dir=runs/x"])
    with pytest.raises(SweepError, match="checkpoint.dir '/shared/ck' is also task 0's"):
        check(tmp_path, [{"optim.lr": 0.1}, {"optim.lr": 0.2}],
              overrides=["checkpoint.dir=/shared/ck"])
    # ... unless it names the task: job variables stand in while checking.
    check(tmp_path, [{"optim.lr": 0.1}, {"optim.lr": 0.2}],
          overrides=["checkpoint.dir=/ck/${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"])


def test_overrides_read_back_as_the_values_they_came_from() -> None:
    values = {"optim.lr": 1e-05, "run.seed": 3, "optim.nesterov": True,
              "run.name": 'we"ird\\ name\t', "optim.betas": [0.9, 0.95], "run.dir": "a b/ü"}
    texts = sweep.overrides_of(values)
    assert {k: cfgmod.parse_override(t)[2] for k, t in zip(values, texts)} == values
    with pytest.raises(SweepError, match="cannot be passed on"):
        sweep.overrides_of({"run.name": "del\x7f"})


def test_each_array_task_takes_its_own_set_and_run_folder(tmp_path: Path) -> None:
    sets = [{"optim.lr": 0.1}, {"optim.lr": 0.2, "run.seed": 7}, {"optim.lr": 0.4}]
    data = sweep.record(sets, "s.toml", tmp_path / "sw")
    path = sweep.save(tmp_path / "sw", data)
    assert sweep.save(tmp_path / "sw", data) == path  # the same sweep again: fine
    with pytest.raises(SweepError, match="already holds another sweep"):
        sweep.save(tmp_path / "sw", sweep.record(sets[:1], "s.toml", tmp_path / "sw"))
    env = {"HPCDP_SWEEP": str(path), "SLURM_ARRAY_TASK_ID": "1"}
    assert sweep.task_overrides(env) == [
        "optim.lr=0.2", "run.seed=7", f'run.dir="{tmp_path / "sw" / "task-1"}"']
    cfg = build(DIGITS, ["optim.lr=0.5", *sweep.task_overrides(env)], {})
    assert (cfg.optim.lr, cfg.run.seed, cfg.run_dir) == (0.2, 7, tmp_path / "sw" / "task-1")
    assert sweep.task_overrides({}) == []
    for bad, message in (({"SLURM_ARRAY_TASK_ID": "3"}, "has 3 task"),
                         ({"SLURM_ARRAY_TASK_ID": ""}, "SLURM_ARRAY_TASK_ID is not set"),
                         ({"HPCDP_SWEEP": str(tmp_path)}, "cannot be read"),
                         ({"HPCDP_SWEEP": DIGITS}, "not a sweep written by hpcdp")):
        with pytest.raises(ConfigError, match=message):
            sweep.task_overrides({**env, **bad})


def test_train_command_applies_the_tasks_set(tmp_path: Path, monkeypatch) -> None:
    from hpcdp.train import command

    path = sweep.save(tmp_path, sweep.record([{"optim.lr": 0.3}], "g", tmp_path))
    monkeypatch.setenv("HPCDP_SWEEP", str(path))
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "0")
    cfg, _ = command.parse_args(["--config", DIGITS, "optim.lr=0.01"])
    assert cfg.optim.lr == 0.3 and cfg.run_dir == tmp_path / "task-0"


def finished(tmp_path: Path, sets, metrics) -> Path:
    sweep_dir = tmp_path / "sw"
    sweep.save(sweep_dir, sweep.record(sets, "g", sweep_dir))
    for i, m in enumerate(metrics):
        if m is not None:
            (sweep_dir / f"task-{i}").mkdir(parents=True)
            (sweep_dir / f"task-{i}" / "summary.json").write_text(json.dumps(m))
    return sweep_dir


def test_collect_one_row_per_task_with_its_state(tmp_path: Path) -> None:
    sweep_dir = finished(tmp_path, [{"optim.lr": 0.1}, {"optim.lr": 0.2}, {"optim.lr": 0.4}],
                         [{"val_acc": 0.5, "steps": 10, "task": "image"},
                          {"val_acc": 0.75, "steps": 10}, None])
    (sweep_dir / "task-2").mkdir()
    columns, rows = sweep.collect(sweep_dir)
    assert columns == ["task", "optim.lr", "state", "val_acc", "steps"]
    assert [r["state"] for r in rows] == ["done", "done", "unfinished"]
    csv = sweep.table(columns, rows, "csv")
    assert csv.splitlines() == ["task,optim.lr,state,val_acc,steps", "0,0.1,done,0.5,10",
                                "1,0.2,done,0.75,10", "2,0.4,unfinished,,"]
    md = sweep.table(columns, rows, "markdown").splitlines()
    assert md[0] == "| task | optim.lr | state | val_acc | steps |"
    assert md[3] == "| 1 | 0.2 | done | 0.75 | 10 |"
    with pytest.raises(SweepError, match="does not exist|cannot be read"):
        sweep.collect(tmp_path / "nothing")


def test_series_one_line_per_setting_of_the_other_keys() -> None:
    rows = [{"optim.lr": lr, "b": b, "val_loss": lr * b} for lr in (0.2, 0.1) for b in (1, 2)]
    rows.append({"optim.lr": 0.3, "b": 1})  # unfinished: no point
    lines = sweep.series(rows, "optim.lr", "val_loss", ["optim.lr", "b"])
    assert lines == {"b=1": [(0.1, 0.1), (0.2, 0.2)], "b=2": [(0.1, 0.2), (0.2, 0.4)]}


def test_plot_writes_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    rows = [{"optim.lr": lr, "val_loss": 1 / lr} for lr in (0.01, 0.1, 1.0)]
    drawn = sweep.plot(rows, "optim.lr", "val_loss", ["optim.lr"], str(tmp_path / "p.png"))
    assert drawn == 3
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_collect_command_table_plot_and_errors(tmp_path: Path, monkeypatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:

    sweep_dir = finished(tmp_path, [{"optim.lr": 0.1}, {"optim.lr": 0.2}],
                         [{"val_acc": 0.5}, {"val_acc": 0.7}])
    out = tmp_path / "t.csv"
    assert cli.main(["collect", str(sweep_dir), "--format", "csv", "--out", str(out)]) == 0
    assert out.read_text().splitlines()[2] == "1,0.2,done,0.7"
    assert cli.main(["collect", str(sweep_dir), "--plot", str(tmp_path / "p.png"),
                       "--x", "run.seed"]) == 2
    assert "--x 'run.seed' is not a swept key; swept: optim.lr" in capsys.readouterr().err
    assert cli.main(["collect", str(sweep_dir), "--plot", str(tmp_path / "p.png")]) == 2
    assert "--metric 'val_loss' is in no task's summary.json yet; found: val_acc" in \
        capsys.readouterr().err
    monkeypatch.setitem(__import__("sys").modules, "matplotlib", None)  # as if not installed
    assert cli.main(["collect", str(sweep_dir), "--plot", str(tmp_path / "p.png"),
                       "--metric", "val_acc"]) == 1
    assert "matplotlib is not installed here: no plot" in capsys.readouterr().err
    assert cli.main(["collect", str(tmp_path / "none")]) == 2
    assert "sweep file" in capsys.readouterr().err
