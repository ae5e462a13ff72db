"""Rendering batch scripts at their edges: every managed option, each bound, each name.

Each test pins down a behaviour that mutation testing (`make mutate`) found
unguarded: an option let through twice, a bound off by one, an error that names
the wrong argument.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hpcdp.cluster import cli, submit
from hpcdp.cluster import render as slurm
from hpcdp.cluster.render import MANAGED, MAX_SIGNAL_LEAD, RenderError, render, time_seconds


def refused(**options: Any) -> str:
    with pytest.raises(RenderError) as err:
        render(**options)
    return str(err.value)


@pytest.mark.parametrize("name", MANAGED)
def test_every_managed_option_is_refused_as_an_extra(name: str) -> None:
    assert {"requeue", "signal", "open-mode", "output"} <= set(MANAGED)
    assert refused(sbatch_options=("--mem=1G", f"--{name}=1")) == (
        f"sbatch_options[1] '--{name}=1' repeats an option render() sets itself; use its "
        f"{name.replace('-', '_')} argument")


def test_signal_lead_up_to_slurms_limit() -> None:
    assert MAX_SIGNAL_LEAD == 65535
    assert "#SBATCH --signal=USR1@65535" in render(time="2-00:00:00", signal_lead=65535)
    assert refused(time="2-00:00:00", signal_lead=65536) == (
        "signal_lead 65536s exceeds Slurm's 65535s")


def test_one_second_limit_is_too_short_for_any_lead() -> None:
    assert refused(time="0:01", signal_lead=1) == (
        "signal_lead (1s) must be shorter than the time limit '0:01' (1s)")
    assert refused(time="0:00") == "time '0:00' is zero; give the job a positive time limit"


def test_time_parts_add_up() -> None:
    assert time_seconds("1:02:03") == 3723
    assert time_seconds("0:02:03") == 123
    with pytest.raises(RenderError) as err:
        time_seconds("1h")
    assert str(err.value) == ("time '1h' is not a Slurm time limit (minutes, MM:SS, HH:MM:SS, "
                              "D-HH, D-HH:MM or D-HH:MM:SS)")


def test_one_task_per_node_is_allowed() -> None:
    assert "#SBATCH --ntasks-per-node=1" in render(ntasks_per_node=1)
    assert refused(ntasks_per_node=0) == "ntasks_per_node must be at least 1, got 0"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"job_name": ""}, "job_name must be a non-empty string, got ''"),
        ({"output": " "}, "output must be a non-empty string, got ' '"),
        ({"venv": ""}, "venv must be a non-empty string, got ''"),
        ({"config": ""}, "config must be a non-empty string, got ''"),
        ({"modules": "gcc"}, "modules must be a list of strings, got 'gcc'"),
        ({"overrides": "a.b=1"}, "overrides must be a list of strings, got 'a.b=1'"),
        ({"sbatch_options": ("--mem=1G", "")}, "sbatch_options[1] must be a non-empty string"),
        ({"env": {"A": ""}}, "env[A] must be a non-empty string, got ''"),
        ({"qos": "a\rb"}, "qos must be one line, got 'a\\rb'"),
    ],
)
def test_errors_name_the_argument(options: dict[str, Any], message: str) -> None:
    assert refused(**options).startswith(message)


def test_flag_options_without_a_value() -> None:
    lines = render(sbatch_options=("--hold", "--mem=1G")).splitlines()
    assert "#SBATCH --hold" in lines and "#SBATCH --mem=1G" in lines


def test_unknown_options_message_in_full() -> None:
    with pytest.raises(RenderError) as err:
        slurm.render_options({"gpus": 1, "nodez": 2})
    assert str(err.value) == ("unknown option(s) gpus, nodez; valid: "
                              + ", ".join(slurm.option_names()))


def test_cli_env_values_keep_their_equals_signs(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["render", "--env", "A=b=c", "--config", "c.toml"]) == 0
    out = capsys.readouterr().out
    assert "export A=b=c" in out and "train_args=(--config c.toml)" in out
    assert cli.main(["render", "--env", "A"]) == 2
    assert "hpcdp slurm render: --env 'A' is not NAME=VALUE" in capsys.readouterr().err


def test_cli_out_targets(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["render", "--out", ""]) == 2
    assert "--out '': expected a file path" in capsys.readouterr().err
    missing = tmp_path / "no" / "job.sbatch"
    assert cli.main(["render", "--out", str(missing)]) == 2
    assert (f"--out {missing}: the folder {str(missing.parent)!r} does not exist"
            in capsys.readouterr().err)
    with pytest.raises(RenderError, match="expected a file path"):
        submit.check_target("--out", "a\0b", overwrite=True)
