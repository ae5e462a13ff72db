"""`hpcdp slurm` as its users meet it: help texts, usage errors, submit through sbatch.

`submit` runs an `sbatch` found on PATH; here a small executable stands in for it that
keeps its arguments and its stdin and answers as `sbatch --parsable` does
("jobid;cluster"), fails, or hangs. Each test pins down a behaviour that mutation testing
(`make mutate`) found unguarded.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

from hpcdp.cluster import cli
from hpcdp.cluster.render import RenderError, render


def fake_sbatch(folder: Path, answer: str = 'echo "4242;main"') -> Path:
    """An `sbatch` in folder/bin that saves its args and stdin beside itself, then `answer`."""
    bin_dir = folder / "bin"
    bin_dir.mkdir(exist_ok=True)
    exe = bin_dir / "sbatch"
    exe.write_text(f'#!/bin/bash\nprintf "%s\\n" "$@" > "{folder}/args"\n'
                   f'cat > "{folder}/stdin"\n{answer}\n')
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


@pytest.fixture
def on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """tmp_path/bin first on PATH, so that `sbatch` is the fake one."""
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    return tmp_path


# ---- submit ----------------------------------------------------------------------------


def test_submit_pipes_the_script_to_sbatch_and_returns_the_job_id(on_path: Path) -> None:
    fake_sbatch(on_path)
    script = render(nodes=2)
    assert cli.submit(script, args=["--hold", "--dependency=afterok:7"]) == "4242"
    assert (on_path / "args").read_text().split("\n") == [
        "--parsable", "--hold", "--dependency=afterok:7", ""]
    assert (on_path / "stdin").read_text() == script


def test_submit_takes_a_plain_job_id_too(tmp_path: Path) -> None:
    exe = fake_sbatch(tmp_path, answer="echo 17")
    assert cli.submit("#!/bin/bash\n", sbatch=str(exe)) == "17"


def test_a_failing_sbatch_is_reported_with_its_message(tmp_path: Path) -> None:
    exe = fake_sbatch(tmp_path, answer='echo "sbatch: error: Invalid account" >&2; exit 1')
    with pytest.raises(RuntimeError) as err:
        cli.submit("#!/bin/bash\n", sbatch=str(exe))
    assert str(err.value) == "sbatch failed (exit 1): sbatch: error: Invalid account"


def test_a_missing_sbatch_is_named(tmp_path: Path) -> None:
    missing = str(tmp_path / "sbatch")
    with pytest.raises(RuntimeError) as err:
        cli.submit("#!/bin/bash\n", sbatch=missing)
    assert str(err.value) == f"{missing} not found: is Slurm's client installed here?"


def test_a_hanging_sbatch_is_reported_not_a_traceback(tmp_path: Path) -> None:
    exe = fake_sbatch(tmp_path, answer="exec sleep 3")  # cut short at 0.5 s
    with pytest.raises(RuntimeError) as err:
        cli.submit("#!/bin/bash\n", sbatch=str(exe), timeout=0.5)
    assert str(err.value) == (f"{exe} did not answer within 0.5s: is Slurm's controller "
                              "reachable?")


def test_cli_submit_prints_the_job_id_and_saves_what_it_sent(
        on_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fake_sbatch(on_path)
    saved = on_path / "job.sbatch"
    assert cli.main(["submit", "--nodes", "3", "--save", str(saved)]) == 0
    assert capsys.readouterr().out == "4242\n"
    assert saved.read_text() == (on_path / "stdin").read_text() == render(nodes=3)


def test_cli_submit_failure_exits_1_with_sbatchs_message(
        on_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fake_sbatch(on_path, answer='echo "sbatch: error: no partition" >&2; exit 3')
    assert cli.main(["submit"]) == 1
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err == "hpcdp slurm submit: sbatch failed (exit 3): sbatch: error: no partition\n"


def test_cli_submit_refuses_to_overwrite_naming_save(
        on_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fake_sbatch(on_path)
    saved = on_path / "job.sbatch"
    saved.write_text("edited by hand\n")
    assert cli.main(["submit", "--save", str(saved)]) == 2
    assert capsys.readouterr().err == (f"hpcdp slurm submit: --save {saved}: already exists; "
                                       "pass --overwrite to replace it\n")
    assert saved.read_text() == "edited by hand\n" and not (on_path / "stdin").exists()


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc")
def test_cli_write_failure_exits_2_naming_the_file(capsys: pytest.CaptureFixture[str]) -> None:
    # /proc/self is a folder, but no file can be created in it (even by root).
    assert cli.main(["render", "--out", "/proc/self/job.sbatch"]) == 2
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err == ("hpcdp slurm render: --out /proc/self/job.sbatch: "
                       "No such file or directory\n")


def test_cli_reads_sys_argv_by_default(monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sys, "argv", ["hpcdp-slurm", "render", "--nodes", "2"])
    assert cli.main() == 0
    assert capsys.readouterr().out == render(nodes=2)


# ---- usage errors and help -------------------------------------------------------------


def usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as err:
        cli.main(argv)
    assert err.value.code == 2
    return capsys.readouterr().err


def test_an_action_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    err = usage_error([], capsys)
    assert err.startswith("usage: hpcdp slurm ")
    assert err.endswith("hpcdp slurm: error: the following arguments are required: action\n")


def test_no_option_is_abbreviated(capsys: pytest.CaptureFixture[str]) -> None:
    err = usage_error(["render", "--node", "2"], capsys)
    assert err.startswith("usage: hpcdp slurm ")
    assert err.endswith("hpcdp slurm: error: unrecognized arguments: --node\n")
    usage_error(["--he"], capsys)  # an error (exit 2), not --help


def help_text(argv: list[str], capsys: pytest.CaptureFixture[str],
              monkeypatch: pytest.MonkeyPatch) -> str:
    """`--help`'s output with its whitespace runs made single spaces (no wrapping)."""
    monkeypatch.setenv("COLUMNS", "400")
    with pytest.raises(SystemExit) as err:
        cli.main(argv)
    assert err.value.code == 0
    return " ".join(capsys.readouterr().out.split())


def test_top_level_help_describes_the_actions(capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    text = help_text(["--help"], capsys, monkeypatch)
    assert text.startswith("usage: hpcdp slurm [-h] {render,submit,status,collect} ... Slurm "
                           "batch scripts for hpcdp training: render (pure), submit (calls "
                           "sbatch). positional arguments: ")
    assert "render print the batch script" in text
    assert "submit render it and submit it with sbatch; print the job id" in text
    assert "status a job's state, restarts" in text and "collect gather a sweep's" in text


HELP_LINES = [
    "--nodes NODES number of nodes, or a range MIN-MAX (then data.global_batch_size must be "
    "set and divide over every rank count: docs/planning.md) (default: 1)",
    "--time TIME time limit: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS "
    "(default: 01:00:00)",
    "--exclusive, --no-exclusive whole nodes",
    "--job-name JOB_NAME job name (%x in --output) (default: hpcdp-train)",
    "--output OUTPUT log file, appended across requeues (default: %x-%j.out)",
    "--partition PARTITION partition (default: None)",
    "--sbatch-options SBATCH_OPTIONS another sbatch option, e.g. --sbatch-options=--mem=0 "
    "(repeatable)",
    "--modules MODULES module to load (repeatable)",
    "--env NAME=VALUE variable to export (repeatable)",
    "key.sub=value training config overrides",
    "--overwrite replace the file --out/--save names if it exists",
]


def test_render_help_explains_every_option(capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    text = help_text(["render", "--help"], capsys, monkeypatch)
    assert text.startswith("usage: hpcdp slurm render [-h] [--nodes NODES] ")
    for line in [*HELP_LINES, "--out OUT write the script here instead of stdout (an existing "
                              "file only with --overwrite)"]:
        assert line in text, line
    for name, help_ in cli.HELP.items():
        assert help_ in text, name


def test_submit_help_explains_save(capsys: pytest.CaptureFixture[str],
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    text = help_text(["submit", "--help"], capsys, monkeypatch)
    for line in [*HELP_LINES, "--save SAVE also write the submitted script here (an existing "
                              "file only with --overwrite)"]:
        assert line in text, line


# ---- messages in full ------------------------------------------------------------------


def test_a_backslash_in_an_extra_option_is_refused_naming_it() -> None:
    with pytest.raises(RenderError) as err:
        render(sbatch_options=("--mem=1G", "--comment=a\\b"))
    assert str(err.value) == ("sbatch_options[1] '--comment=a\\\\b' contains a backslash, which "
                              "sbatch would read as an escape; leave it out")


def test_bad_signal_and_plugin_messages_in_full() -> None:
    with pytest.raises(RenderError) as err:
        render(signal="HUP")
    assert str(err.value) == "signal 'HUP' is not one of USR1, USR2, TERM"
    with pytest.raises(RenderError) as err:
        render(srun_mpi="pmi x")
    assert str(err.value) == ("srun_mpi 'pmi x' is not an MPI plugin name like pmix "
                              "(see `srun --mpi=list`)")
