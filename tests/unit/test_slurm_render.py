"""Rendering Slurm batch scripts: golden files, validation, the command line.

A golden mismatch shows a unified diff; regenerate the goldens (and
slurm/train.sbatch, which is the rendering of the defaults) with
`HPCDP_UPDATE_GOLDEN=1 python -m pytest tests/unit/test_slurm_render.py`.
"""

from __future__ import annotations

import difflib
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from hpcdp.cluster import cli
from hpcdp.cluster import render as slurm
from hpcdp.cluster.render import RenderError, render, render_options, time_seconds

REPO = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).resolve().parent / "golden"

CASES: dict[str, dict[str, Any]] = {
    "cpu_single_node": {},
    "gpu_multi_node": {
        "nodes": 8,
        "gpus_per_node": 4,
        "cpus_per_task": 8,
        "time": "1-12:00:00",
        "partition": "gpu",
        "account": "proj-42",
        "qos": "normal",
        "constraint": "a100&ib",
        "exclusive": True,
        "job_name": "resnet cifar",
        "output": "logs/%x-%j.out",
        "signal_lead": 600,
        "sbatch_options": ("--mem=0", "--mail-type=END,FAIL", "--comment=it's mine"),
        "modules": ("gcc/12", "openmpi/4.1.5", "cuda/12.2"),
        "setup": ("export NCCL_DEBUG=WARN", "source $HOME/site-env.sh"),
        "env": {"NCCL_IB_HCA": "mlx5_0,mlx5_1", "HPCDP_NOTE": "a b; $(not run)"},
        "venv": "/proj/env with space/.venv",
        "srun_mpi": "pmix_v4",
        "config": "configs/resnet.toml",
        "overrides": ("data.path=/scratch/data sets/cifar", "optim.lr=0.4"),
    },
    "cpu_tasks_term": {
        "nodes": 2,
        "ntasks_per_node": 4,
        "time": "90",
        "signal": "TERM",
        "signal_lead": 120,
        "config": "hpcdp/configs/digits.toml",
    },
}


def check_golden(path: Path, text: str) -> None:
    """Compare with a golden file; rewrite it instead when HPCDP_UPDATE_GOLDEN=1."""
    if os.environ.get("HPCDP_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return
    assert path.exists(), f"{path} missing; create it with HPCDP_UPDATE_GOLDEN=1"
    expected = path.read_text()
    if text != expected:
        diff = "".join(difflib.unified_diff(
            expected.splitlines(keepends=True), text.splitlines(keepends=True),
            fromfile=f"{path.name} (golden)", tofile="rendered",
        ))
        pytest.fail(f"rendering differs from {path}:\n{diff}\n"
                    "(HPCDP_UPDATE_GOLDEN=1 regenerates it if the change is intended)")


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden(name: str) -> None:
    check_golden(GOLDEN / f"{name}.sbatch", render(**CASES[name]))


def test_train_template_is_the_default_rendering() -> None:
    check_golden(REPO / "slurm" / "train.sbatch", render())


def test_prep_script_is_rendered_from_the_same_prologue() -> None:
    check_golden(REPO / "slurm" / "prep.sbatch", slurm.render_prep())
    # One source for the part both scripts share: environment, export, MPI plugin.
    assert slurm.PROLOGUE in slurm.render_prep() and slurm.PROLOGUE in render()
    assert "SLURM_EXPORT_ENV=ALL" in slurm.PROLOGUE


def test_usr2_is_the_warning_signal_and_the_trainings() -> None:
    """USR1 is also used by libraries (NCCL): USR2, chosen once, reaches the config too."""
    text = render(signal="USR2")
    assert "#SBATCH --signal=USR2@300" in _sbatch_lines(text)
    assert """signal_args=('preempt.signals=["USR2","TERM"]')""" in text
    from hpcdp import config

    cfg = config.build(None, ["data.path=d", 'preempt.signals=["USR2","TERM"]'])
    assert cfg.preempt.signals == ["USR2", "TERM"]
    # USR1 and TERM are caught by default: no override then.
    assert "signal_args=" not in render() and "signal_args=" not in render(signal="TERM")


def test_srun_mpi_is_the_sites_unless_named() -> None:
    assert "HPCDP_SRUN_MPI=" not in render()
    assert "export HPCDP_SRUN_MPI=cray_shasta" in render(srun_mpi="cray_shasta")


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash not installed")
@pytest.mark.parametrize("name", sorted(CASES))
def test_rendered_script_is_valid_bash(name: str, tmp_path: Path) -> None:
    script = tmp_path / "job.sbatch"
    script.write_text(render(**CASES[name]))
    done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def _sbatch_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("#SBATCH ")]


def test_every_value_is_quoted_and_order_is_stable() -> None:
    text = render(**CASES["gpu_multi_node"])
    lines = _sbatch_lines(text)
    assert lines == [
        "#SBATCH --job-name='resnet cifar'", "#SBATCH --nodes=8", "#SBATCH --ntasks-per-node=4",
        "#SBATCH --gpus-per-node=4", "#SBATCH --cpus-per-task=8", "#SBATCH --exclusive",
        "#SBATCH --time=1-12:00:00", "#SBATCH --partition=gpu", "#SBATCH --account=proj-42",
        "#SBATCH --qos=normal", "#SBATCH --constraint='a100&ib'", "#SBATCH --signal=USR1@600",
        "#SBATCH --requeue", "#SBATCH --open-mode=append", "#SBATCH --output=logs/%x-%j.out",
        "#SBATCH --mem=0", "#SBATCH --mail-type=END,FAIL", "#SBATCH --comment='it'\"'\"'s mine'",
    ]
    assert "#SBATCH --constraint='a100&ib'" in lines
    assert "#SBATCH --comment='it'\"'\"'s mine'" in lines
    assert "export HPCDP_NOTE='a b; $(not run)'" in text
    assert "train_args=(--config configs/resnet.toml 'data.path=/scratch/data sets/cifar' " \
           "optim.lr=0.4)" in text
    # Rendering is a pure function: another rendering in between leaves no trace.
    render(**CASES["cpu_tasks_term"], sbatch_options=("--mem=8G",), env={"A": "1"})
    assert render(**CASES["gpu_multi_node"]) == text


def test_default_asks_for_signal_requeue_and_append() -> None:
    lines = _sbatch_lines(render())
    assert "#SBATCH --signal=USR1@300" in lines
    assert "#SBATCH --requeue" in lines
    assert "#SBATCH --open-mode=append" in lines
    # No task count by default: `sbatch --ntasks=N` or `--gpus-per-node=G` decide.
    assert not any("ntasks" in line for line in lines)


def test_gpus_imply_one_task_per_gpu() -> None:
    lines = _sbatch_lines(render(nodes=2, gpus_per_node=2))
    assert "#SBATCH --ntasks-per-node=2" in lines
    assert "#SBATCH --gpus-per-node=2" in lines


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"nodes": 0}, "nodes must be at least 1"),
        ({"nodes": True}, "nodes must be an integer"),
        ({"nodes": "2"}, "nodes must be an integer"),
        ({"gpus_per_node": -1}, "gpus_per_node must be at least 0"),
        ({"gpus_per_node": 4, "ntasks_per_node": 2}, "must equal gpus_per_node"),
        ({"cpus_per_task": 0}, "cpus_per_task must be at least 1"),
        ({"time": "1h"}, "is not a Slurm time limit"),
        ({"time": "1:2:3:4"}, "is not a Slurm time limit"),
        ({"time": "0"}, "is zero"),
        ({"time": "10", "signal_lead": 600}, "must be shorter than the time limit"),
        ({"signal_lead": 0}, "signal_lead must be at least 1"),
        ({"signal_lead": 70000, "time": "2-00:00:00"}, "exceeds Slurm's"),
        ({"signal": "KILL"}, "signal 'KILL' is not one of"),
        ({"signal": "B:USR1"}, "is not one of"),
        ({"partition": ""}, "partition must be a non-empty string"),
        ({"account": "a\n#SBATCH --qos=high"}, "account must be one line"),
        ({"sbatch_options": ("mem=8G",)}, "is not a long sbatch option"),
        ({"sbatch_options": ("--nodes=2",)}, "use its nodes argument"),
        ({"sbatch_options": "--mem=8G"}, "must be a list of strings"),
        ({"env": {"1BAD": "x"}}, "not a valid shell variable name"),
        ({"overrides": ("lr 0.1",)}, "is not of the form key.sub=value"),
        ({"setup": ("module load a\nrm -rf x",)}, "setup[0] must be one line"),
        ({"exclusive": "yes"}, "exclusive must be true or false"),
        ({"partition": "gpu\\n"}, "contains a backslash"),
        ({"job_name": "a\\b"}, "contains a backslash"),
        ({"sbatch_options": ("--comment=x\\y",)}, "contains a backslash"),
        ({"srun_mpi": "pmix --x"}, "is not an MPI plugin name"),
    ],
)
def test_invalid_requests_are_refused(options: dict[str, Any], message: str) -> None:
    with pytest.raises(RenderError) as err:
        render(**options)
    assert message in str(err.value)


def test_time_formats() -> None:
    assert time_seconds("30") == 1800
    assert time_seconds("5:30") == 330
    assert time_seconds("01:00:00") == 3600
    assert time_seconds("2-3") == (2 * 24 + 3) * 3600
    assert time_seconds("1-00:30") == 24 * 3600 + 1800
    assert time_seconds("1-00:00:10") == 24 * 3600 + 10


def test_unknown_options_raise_with_the_valid_ones() -> None:
    with pytest.raises(RenderError) as err:
        render_options({"nodes": 2, "gpus": 4})
    assert "unknown option(s) gpus" in str(err.value)
    assert "gpus_per_node" in str(err.value)
    assert render_options({"nodes": 2}) == render(nodes=2)


def test_cli_options_come_from_the_signature(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["render", "--nodes", "8", "--gpus-per-node", "4", "--cpus-per-task", "8",
            "--time", "1-12:00:00", "--partition", "gpu", "--account", "proj-42",
            "--qos", "normal", "--constraint", "a100&ib", "--exclusive",
            "--job-name", "resnet cifar", "--output", "logs/%x-%j.out", "--signal-lead", "600",
            "--sbatch-options=--mem=0", "--sbatch-options=--mail-type=END,FAIL",
            "--sbatch-options=--comment=it's mine",
            "--modules", "gcc/12", "--modules", "openmpi/4.1.5", "--modules", "cuda/12.2",
            "--setup", "export NCCL_DEBUG=WARN", "--setup", "source $HOME/site-env.sh",
            "--env", "NCCL_IB_HCA=mlx5_0,mlx5_1", "--env", "HPCDP_NOTE=a b; $(not run)",
            "--venv", "/proj/env with space/.venv", "--srun-mpi", "pmix_v4",
            "--config", "configs/resnet.toml",
            "data.path=/scratch/data sets/cifar", "optim.lr=0.4"]
    assert cli.main(argv) == 0
    assert capsys.readouterr().out == render(**CASES["gpu_multi_node"])
    names = {a.lstrip("-").replace("-", "_") for a in argv if a.startswith("--")}
    names = {n.split("=")[0] for n in names}
    # srun_options and container (--container-*): tests/unit/test_containers.py; script:
    # tests/unit/test_slurm_script.py.
    assert names == set(slurm.option_names()) - {"overrides", "signal", "ntasks_per_node",
                                                 "srun_options", "container", "script"}


def test_cli_refuses_unknown_and_invalid(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as err:
        cli.main(["render", "--gpus", "4"])
    assert err.value.code == 2
    assert cli.main(["render", "--nodes", "0"]) == 2
    assert "nodes must be at least 1" in capsys.readouterr().err


def test_cli_help_lists_every_option(capsys: pytest.CaptureFixture[str]) -> None:
    for action in ("render", "submit"):
        with pytest.raises(SystemExit) as err:
            cli.main([action, "--help"])
        assert err.value.code == 0
        text = capsys.readouterr().out
        for name in slurm.option_names():
            if name != "overrides":
                assert "--" + name.replace("_", "-") in text, name
        assert "%x-%j.out" in text


def test_cli_writes_out_file(tmp_path: Path) -> None:
    out = tmp_path / "job.sbatch"
    assert cli.main(["render", "--nodes", "2", "--out", str(out)]) == 0
    assert out.read_text() == render(nodes=2)
