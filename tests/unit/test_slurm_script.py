"""A user's own training script under Slurm: `--script FILE -- ARGS` in render, the CLI and
slurm/train.sbatch (run with the stand-ins of test_sbatch_launch), and a user's task
reference passing through render unchanged."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from test_sbatch_launch import run_script

from hpcdp.cluster import cli
from hpcdp.cluster.render import RenderError, render


def shell_array(script: str, name: str) -> list[str]:
    """The words of the rendered `name=(...)` line."""
    line = next(x for x in script.splitlines() if x.startswith(f"{name}=("))
    return shlex.split(line[len(name) + 2:-1])


def test_the_trainer_runs_unless_a_script_is_named() -> None:
    assert shell_array(render(), "entry") == ["-m", "hpcdp.train"]
    own = render(script="my train.py", config="c.toml", overrides=["--epochs", "3", "x=1"])
    assert shell_array(own, "entry") == ["my train.py"]
    # A script's arguments are its own: not refused for not being key=value.
    assert shell_array(own, "train_args") == ["--config", "c.toml", "--epochs", "3", "x=1"]
    with pytest.raises(RenderError, match="not of the form key.sub=value"):
        render(overrides=["--epochs"])
    for bad in ("", "-m", "a\nb"):
        with pytest.raises(RenderError):
            render(script=bad)


def test_cli_takes_the_scripts_arguments_after_the_double_dash(
        capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["render", "--script", "train_mine.py", "--", "--lr", "0.1", "run.dir=r"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert out == render(script="train_mine.py", overrides=["--lr", "0.1", "run.dir=r"])


def test_a_task_reference_passes_through_render_unchanged() -> None:
    ref = "task.name=/abs/path/my tasks/file.py:TASK"
    assert shell_array(render(overrides=[ref, "optim.lr=0.1"]), "train_args") == [
        ref, "optim.lr=0.1"]


def test_the_batch_script_runs_the_named_script(tmp_path: Path) -> None:
    status, out, standin = run_script(tmp_path, {}, "--script", "mine.py", "--", "a=1", "--b")
    assert status == 0, out
    args = (standin / "srun.args").read_text().splitlines()
    assert args[-3:] == ["mine.py", "a=1", "--b"], args
    assert "hpcdp.train" not in args
    status, out, standin = run_script(tmp_path, {}, "key=1")  # the trainer, as before
    assert (standin / "srun.args").read_text().splitlines()[-3:] == ["-m", "hpcdp.train",
                                                                     "key=1"]
    status, out, _ = run_script(tmp_path, {}, "--script")
    assert status == 2 and "--script needs a file name" in out
