"""`hpcdp slurm submit` for sweeps and chains, with a stand-in `sbatch` on PATH.

The stand-in records each call's arguments and the script it was given on stdin,
and answers as `sbatch --parsable` does (`<id>;<cluster>`, ids 100, 101, ...), or
fails at the call SBATCH_FAIL_AT. The recorded scripts are then run under bash
with stand-ins for srun and scontrol, as tests/unit/test_sbatch_launch.py does.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from hpcdp.cluster import cli
from hpcdp.runtime.preempt import EXIT_REQUEUE

REPO = Path(__file__).resolve().parents[2]
DIGITS = str(REPO / "hpcdp" / "configs" / "digits.toml")

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="bash not installed")

SBATCH = """#!/bin/bash
n=0
while [[ -e "$STANDIN/call-$n.args" ]]; do n=$((n + 1)); done
printf '%s\\n' "$@" > "$STANDIN/call-$n.args"
cat > "$STANDIN/call-$n.script"
if [[ "${SBATCH_FAIL_AT:-}" == "$n" ]]; then
  echo "sbatch: error: Batch job submission failed: Invalid account" >&2; exit 1
fi
echo "$((100 + n));hpcdplocal"
"""
SRUN = """#!/bin/bash
printf '%s\\n' "$@" > "$STANDIN/srun.args"
env > "$STANDIN/srun.env"
exit "${SRUN_EXIT:-0}"
"""
SCONTROL = """#!/bin/bash
if [[ "$1" == show ]]; then echo "JobId=1 JobState=RUNNING Reason=None"; exit 0; fi
if [[ "$1" == requeue ]]; then echo "$2" >> "$STANDIN/requeued"; exit 0; fi
exit 1
"""


@pytest.fixture
def standin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    where = tmp_path / "bin"
    where.mkdir()
    for name, text in (("sbatch", SBATCH), ("srun", SRUN), ("scontrol", SCONTROL)):
        (where / name).write_text(text)
        (where / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{where}:{os.environ['PATH']}")
    monkeypatch.setenv("STANDIN", str(where))
    monkeypatch.delenv("SBATCH_FAIL_AT", raising=False)
    return where


def calls(standin: Path) -> list[tuple[list[str], str]]:
    """(arguments, script) of each sbatch call, in order."""
    out, n = [], 0
    while (standin / f"call-{n}.args").exists():
        out.append(((standin / f"call-{n}.args").read_text().splitlines(),
                    (standin / f"call-{n}.script").read_text()))
        n += 1
    return out


def submit(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(["submit", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def run_script(script: str, standin: Path, env: dict[str, str], *args: str) -> tuple[int, str]:
    path = standin.parent / "job.sbatch"
    path.write_text(script)
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("SLURM_", "OMP_", "HPCDP_"))}
    done = subprocess.run(["bash", str(path), *args], env={**base, **env}, capture_output=True,
                          text=True, timeout=60, check=False)
    return done.returncode, done.stdout + done.stderr


def test_grid_sweep_is_one_throttled_array_over_the_saved_sets(
        standin: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sweep_dir = tmp_path / "sw"
    code, out, err = submit(capsys, "--grid", "optim.lr=0.05,0.1,0.2", "--grid",
                            "data.global_batch_size=32,64", "--throttle", "2", "--sweep-dir",
                            str(sweep_dir), "--ntasks-per-node", "2", "--config", DIGITS,
                            "data.path=/data/digits")
    assert code == 0, err
    assert out == "100\n"
    [(args, script)] = calls(standin)
    assert args == ["--parsable", "--array=0-5%2"]
    assert f"#SBATCH --output={sweep_dir}/%x-%A_%a.out" in script
    assert f"export HPCDP_SWEEP={sweep_dir}/sweep.json" in script
    saved = json.loads((sweep_dir / "sweep.json").read_text())
    assert saved["keys"] == ["optim.lr", "data.global_batch_size"]
    assert saved["tasks"][3] == {"run_dir": str(sweep_dir / "task-3"),
                                 "overrides": {"optim.lr": 0.1, "data.global_batch_size": 64}}


def test_sweep_file_task_requeues_alone_and_sees_its_sweep(
        standin: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sets = tmp_path / "lr.csv"
    sets.write_text("optim.lr\n0.1\n0.2\n")
    code, _, err = submit(capsys, "--array", str(sets), "--sweep-dir", str(tmp_path / "sw"),
                          "--config", DIGITS)
    assert code == 0, err
    [(args, script)] = calls(standin)
    assert args == ["--parsable", "--array=0-1"]
    env = {"SRUN_EXIT": str(EXIT_REQUEUE), "SLURM_JOB_ID": "41", "SLURM_ARRAY_JOB_ID": "40",
           "SLURM_ARRAY_TASK_ID": "1"}
    status, out = run_script(script, standin, env)
    assert status == 0, out
    assert (standin / "requeued").read_text().split() == ["40_1"]  # not the whole array
    srun_env = (standin / "srun.env").read_text().splitlines()
    assert f"HPCDP_SWEEP={tmp_path / 'sw' / 'sweep.json'}" in srun_env


@pytest.mark.parametrize(("argv", "message"), [
    (["--grid", "optim.lrr=0.1,0.2"], "unknown key 'optim.lrr'"),
    (["--grid", "optim.lr=0.1,fast"], "task 1 (optim.lr='fast'): optim.lr: expected float"),
    (["--grid", "optim.lr=0.1", "run.dir=x"], "leave run.dir out"),
    (["--grid", "optim.lr=0.1", "--output", "log.out"], "include %a"),
    (["--grid", "optim.lr=0.1", "--throttle", "0"], "--throttle must be at least 1"),
    (["--grid", "optim.lr=0.1", "--env", "HPCDP_SWEEP=x"], "set by the sweep itself"),
    (["--array", "EMPTY"], "no override sets"),
    (["--throttle", "2"], "go with a sweep"),
])
def test_bad_sweeps_fail_before_sbatch(standin: Path, tmp_path: Path, argv: list[str],
                                       message: str, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty.csv").write_text("optim.lr\n")
    argv = [str(tmp_path / "empty.csv") if a == "EMPTY" else a for a in argv]
    if "--throttle" not in argv or "--grid" in argv:
        argv += ["--sweep-dir", str(tmp_path / "sw")]
    code, out, err = submit(capsys, *argv, "--config", DIGITS)
    assert code == 2 and out == ""
    assert message in err, err
    assert calls(standin) == []
    assert not (tmp_path / "sw" / "sweep.json").exists()


def test_sweep_needs_its_folder(standin: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = submit(capsys, "--grid", "optim.lr=0.1", "--config", DIGITS)
    assert code == 2 and "--sweep-dir is needed" in err
    assert calls(standin) == []


def test_prep_then_train_after_it_succeeds(standin: Path, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = submit(capsys, "--prep", "digits --out 'data/my digits'", "--prep-ntasks",
                            "2", "--partition", "cpu", "--config", DIGITS)
    assert code == 0, err
    assert out == "101\n" and "preparation job 100" in err
    (prep_args, prep), (train_args, train) = calls(standin)
    assert prep_args == ["--parsable", "--ntasks=2", "--time=00:30:00", "--partition=cpu"]
    assert "#SBATCH --job-name=hpcdp-prep" in prep
    assert train_args == ["--parsable", "--dependency=afterok:100"]
    assert "#SBATCH --job-name=hpcdp-train" in train
    # The arguments reach the preparation command (sbatch reads the script on stdin).
    status, log = run_script(prep, standin, {"SLURM_NTASKS": "2"})
    assert status == 0, log
    args = (standin / "srun.args").read_text().splitlines()
    assert args[-5:] == ["hpcdp", "prep", "digits", "--out", "data/my digits"]


def test_a_failed_second_submission_names_the_first(
        standin: Path, capsys: pytest.CaptureFixture[str], monkeypatch) -> None:
    monkeypatch.setenv("SBATCH_FAIL_AT", "1")
    code, out, err = submit(capsys, "--prep", "digits --out d", "--config", DIGITS)
    assert code == 1 and out == ""
    assert "Invalid account" in err and "already submitted: prep 100" in err


def test_segments_chain_by_singleton_without_requeue(
        standin: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = submit(capsys, "--segments", "3", "--job-name", "r1", "--after", "55",
                            "--config", DIGITS)
    assert code == 0, err
    assert out.split() == ["100", "101", "102"]
    for args, script in calls(standin):
        assert args == ["--parsable", "--dependency=afterok:55,singleton", "--no-requeue"]
        assert "#SBATCH --job-name=r1" in script
    code, _, err = submit(capsys, "--segments", "2", "--config", DIGITS)
    assert code == 2 and "give the chain its own --job-name" in err
    code, _, err = submit(capsys, "--after", "12;rm", "--config", DIGITS)
    assert code == 2 and "is not a job id" in err
    assert len(calls(standin)) == 3


def test_sweep_after_prep_and_save(standin: Path, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    save = tmp_path / "sweep.sbatch"
    code, out, err = submit(capsys, "--prep", "digits --out d", "--grid", "run.seed=1,2,3",
                            "--sweep-dir", str(tmp_path / "sw"), "--save", str(save),
                            "--config", DIGITS)
    assert code == 0, err
    (_, _), (train_args, train) = calls(standin)
    assert train_args == ["--parsable", "--dependency=afterok:100", "--array=0-2"]
    assert save.read_text() == train
    code, _, err = submit(capsys, "--grid", "run.seed=1", "--sweep-dir", str(tmp_path / "sw"),
                          "--config", DIGITS)
    assert code == 2 and "already holds another sweep" in err


def test_sbatch_options_may_not_repeat_what_the_chain_sets(
        standin: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--grid", "run.seed=1,2", "--sweep-dir", str(tmp_path / "sw"),
                  "--sbatch-options=--array=0-9"],
                 ["--after", "5", "--sbatch-options=--dependency=afterany:4"]):
        code, _, err = submit(capsys, *argv, "--config", DIGITS)
        assert code == 2 and "sets --" in err, err
    assert calls(standin) == []
    # Options the chain does not set pass through.
    code, _, err = submit(capsys, "--after", "5", "--sbatch-options=--mem=1G", "--config", DIGITS)
    assert code == 0, err
    assert "#SBATCH --mem=1G" in calls(standin)[0][1]


def test_a_chains_training_config_is_checked_before_sbatch(
        standin: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = submit(capsys, "--prep", "digits --out d", "--config", DIGITS,
                          "optim.lr=fast")
    assert code == 2, err
    assert "the training's config: optim.lr: expected float, got str 'fast'" in err
    code, _, err = submit(capsys, "--segments", "2", "--job-name", "x", "--config", DIGITS,
                          "checkpoint.dir=/ck/${SLURM_JOB_ID}")  # a job variable: fine
    assert code == 0, err
    assert len(calls(standin)) == 2
