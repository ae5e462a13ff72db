"""Containers: launch prefixes and pyxis options, their goldens, and the batch script run.

No container runtime is installed here, so the rendered script runs under bash with
stand-ins first on PATH: `srun` and `apptainer`/`singularity`/`shifter` record their
arguments and environment and then run what they were given, as the real ones do;
the training command is a stand-in `python` (HPCDP_PYTHON) that exits or waits for a
signal as a test arranges. What a real runtime does with an image is not tested.
Regenerate the goldens with `HPCDP_UPDATE_GOLDEN=1 python -m pytest
tests/unit/test_containers.py`.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from test_sbatch_launch import SCONTROL
from test_slurm_render import GOLDEN, check_golden

from hpcdp.cluster import cli, containers
from hpcdp.cluster.containers import Container, ContainerError
from hpcdp.cluster.render import RenderError, render
from hpcdp.runtime.preempt import EXIT_REQUEUE

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="bash not installed")

APPTAINER = {"runtime": "apptainer", "image": "/images/hpcdp.sif",
             "mounts": ["/scratch", "/data:/data:ro"], "options": ["--cleanenv"]}
CASES: dict[str, dict[str, Any]] = {
    "apptainer": {"nodes": 2, "gpus_per_node": 4, "container": APPTAINER,
                  "env": {"FI_PROVIDER": "cxi"}, "config": "my.toml"},
    "pyxis": {"nodes": 2, "gpus_per_node": 8, "srun_options": ["--cpu-bind=cores"],
              "container": {"runtime": "pyxis", "image": "nvcr.io#nvidia/pytorch:24.05-py3",
                            "mounts": ["/scratch:/scratch"],
                            "options": ["--container-workdir=/scratch/run",
                                        "--no-container-mount-home"]}},
    "shifter": {"container": {"runtime": "shifter", "image": "docker:me/hpcdp:1.0",
                              "mounts": ["/pscratch/me:/data"], "options": ["--module=gpu"]},
                "srun_mpi": "cray_shasta"},
}

# srun stand-in: records, then runs the command after its options in the background,
# passing on the signals it gets, and exits with the command's status.
SRUN = """#!/bin/bash
printf '%s\\n' "$@" > "$STANDIN/srun.args"
env > "$STANDIN/srun.env"
while [[ "$1" == --* ]]; do shift; done
"$@" &
child=$!
for s in USR1 USR2 TERM; do
  trap "echo $s >> '$STANDIN/srun.signals'; kill -$s $child" "$s"
done
while kill -0 "$child" 2> /dev/null; do sleep 0.05; done
wait "$child"
"""
# Container runtime stand-in (apptainer, singularity, shifter): records, then becomes
# the command after its options and the image, as `exec` does.
RUNTIME = """#!/bin/bash
me="$(basename "$0")"
printf '%s\\n' "$@" > "$STANDIN/$me.args"
env > "$STANDIN/$me.env"
[[ "$me" == shifter ]] || { [[ "$1" == exec ]] || exit 64; shift; }
while [[ "$1" == -* ]]; do [[ "$1" == --bind ]] && shift; shift; done
[[ "$me" == shifter ]] || shift  # the image
exec "$@"
"""
# The training command: records, then exits as PY_DOES says or waits for USR1 and
# exits EXIT_REQUEUE (a rank that checkpointed and could not requeue: no scontrol in
# the image).
PYTHON = """#!/bin/bash
printf '%s\\n' "$@" > "$STANDIN/python.args"
env > "$STANDIN/python.env"
does="${PY_DOES:-exit0}"
case "$does" in
  wait-usr1)
    trap 'echo USR1 >> "$STANDIN/python.signals"; exit @EXIT_REQUEUE@' USR1
    touch "$STANDIN/python.started"
    for (( i = 0; i < 400; i++ )); do sleep 0.05; done
    exit 3 ;;  # no signal came within 20 s
  exit*) exit "${does#exit}" ;;
esac
""".replace("@EXIT_REQUEUE@", str(EXIT_REQUEUE))


def standins(tmp_path: Path, runtimes: tuple[str, ...]) -> Path:
    folder = tmp_path / "bin"
    folder.mkdir(exist_ok=True)
    scripts = {"srun": SRUN, "scontrol": SCONTROL, "python": PYTHON,
               **dict.fromkeys(runtimes, RUNTIME)}
    for name, text in scripts.items():
        (folder / name).write_text(text)
        (folder / name).chmod(0o755)
    return folder


def job_env(folder: Path, **extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("SLURM_", "OMP_", "MKL_", "HPCDP_"))}
    # Only the stand-ins, the system's tools and this venv (the batch shell's python3,
    # which works out the layout, as HPCDP_VENV's would): no real runtime can be picked up.
    path = os.pathsep.join((str(folder), str(Path(sys.executable).parent), "/usr/bin:/bin"))
    return {**base, "PATH": path, "STANDIN": str(folder),
            "HPCDP_PYTHON": str(folder / "python"), "SLURM_JOB_ID": "41", **extra}


def start(tmp_path: Path, options: dict[str, Any], runtimes: tuple[str, ...],
          **env: str) -> tuple[subprocess.Popen[str], Path]:
    script = tmp_path / "job.sbatch"
    script.write_text(render(**options))
    folder = standins(tmp_path, runtimes)
    proc = subprocess.Popen(["bash", str(script), "optim.lr=0.1"], env=job_env(folder, **env),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    return proc, folder


def finish(proc: subprocess.Popen[str]) -> tuple[int, str]:
    """The script's status and output; the script and its stand-ins ended after 60 s."""
    try:
        out, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"the batch script ran over 60 s:\n{out}")
    return proc.returncode, out


def recorded(folder: Path, name: str) -> list[str]:
    return (folder / f"{name}.args").read_text().splitlines()


def env_of(folder: Path, name: str) -> dict[str, str]:
    lines = (folder / f"{name}.env").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line)


# ---- pure: settings -> prefix and srun options ------------------------------------------


def test_prefix_and_srun_options_per_runtime() -> None:
    box = containers.from_mapping(APPTAINER)
    assert box.prefix() == ["apptainer", "exec", "--nv", "--bind", "/scratch,/data:/data:ro",
                            "--cleanenv", "/images/hpcdp.sif"]
    assert box.srun_options() == []
    assert Container("singularity", "i.sif", gpus="amd").prefix() == [
        "singularity", "exec", "--rocm", "i.sif"]
    assert Container("apptainer", "i.sif", gpus="none").prefix() == ["apptainer", "exec",
                                                                      "i.sif"]
    assert Container("shifter", "docker:a/b", ("/x:/y", "/p:/q")).prefix() == [
        "shifter", "--image=docker:a/b", "--volume=/x:/y", "--volume=/p:/q"]
    pyxis = Container("pyxis", "repo#img", ("/a:/a", "/b"), options=("--container-writable",))
    assert pyxis.prefix() == []
    assert pyxis.srun_options() == ["--container-image=repo#img", "--container-mounts=/a:/a,/b",
                                    "--container-writable"]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"image": "i"}, "container.runtime must be one of apptainer, singularity, shifter, "
                         "pyxis, got None"),
        ({"runtime": "apptainr", "image": "i"}, "(did you mean 'apptainer'?)"),
        ({"runtime": "pyxis"}, "container.image is missing"),
        ({"runtime": "pyxis", "image": ""}, "container.image must be a non-empty string"),
        ({"runtime": "pyxis", "image": "i", "mount": ["/a"]},
         "unknown key 'mount' (did you mean 'mounts'?)"),
        ({"runtime": "apptainer", "image": "i", "mounts": "/a"}, "mounts must be a list"),
        ({"runtime": "apptainer", "image": "i", "mounts": ["/a,/b"]}, "is not one mount"),
        ({"runtime": "apptainer", "image": "i", "mounts": [":/b"]}, "is not one mount"),
        ({"runtime": "apptainer", "image": "i", "gpus": "intel"}, "gpus must be one of"),
        ({"runtime": "pyxis", "image": "i", "gpus": "nvidia"},
         "gpus applies to apptainer and singularity only"),
        ({"runtime": "pyxis", "image": "i", "options": ["--mem=1G"]},
         "is not a pyxis srun option"),
        ({"runtime": "pyxis", "image": "i", "options": ["--container-image=j"]},
         "use the container's image setting"),
        ({"runtime": "apptainer", "image": "i", "options": ["rm -rf"]},
         "is not a apptainer option"),
        ({"runtime": "shifter", "image": "i\nj"}, "container.image must be one line"),
        ({"runtime": "shifter", "image": "i", "mounts": ["/a:/b", "/c"]},
         "container.mounts[1] '/c': shifter needs SRC:DST"),
    ],
)
def test_bad_settings_are_refused_by_name(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ContainerError) as err:
        containers.from_mapping(data)
    assert message in str(err.value)
    with pytest.raises(RenderError) as err:  # and render() says the same
        render(container=data)
    assert message in str(err.value)


def test_merge_field_by_field_a_new_runtime_replaces() -> None:
    site = {"runtime": "apptainer", "image": "a.sif", "mounts": ["/s"], "gpus": "amd"}
    assert containers.merge(site, None) == site
    assert containers.merge(site, {"image": "b.sif", "mounts": ["/t"]}) == {
        "runtime": "apptainer", "image": "b.sif", "mounts": ["/s", "/t"], "gpus": "amd"}
    assert containers.merge(site, {"runtime": "pyxis", "image": "c"}) == {
        "runtime": "pyxis", "image": "c"}
    assert containers.merge(site, {"runtime": "none"}) is None
    assert containers.merge(None, {"runtime": "shifter", "image": "d"}) == {
        "runtime": "shifter", "image": "d"}


def test_srun_options_the_script_sets_are_refused() -> None:
    with pytest.raises(RenderError, match=r"srun_options\[1\] '--mpi=pmix' repeats an option "
                                          r"the script sets itself \(.*\); use srun_mpi"):
        render(srun_options=["--cpu-bind=cores", "--mpi=pmix"])
    with pytest.raises(RenderError, match="'--ntasks=2' repeats an option"):
        render(srun_options=["--ntasks=2"])
    with pytest.raises(RenderError, match="srun_options\\[0\\] 'cores' is not a long srun"):
        render(srun_options=["cores"])


# ---- rendered: goldens and the command line -----------------------------------------------


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden(name: str) -> None:
    check_golden(GOLDEN / f"container_{name}.sbatch", render(**CASES[name]))


def test_no_container_renders_empty_hooks() -> None:
    lines = render().splitlines()
    assert "srun_options=()" in lines and "launch_prefix=()" in lines


def test_cli_container_options(capsys: pytest.CaptureFixture[str],
                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HPCDP_SITE", raising=False)
    argv = ["render", "--nodes", "2", "--gpus-per-node", "4", "--container-runtime", "apptainer",
            "--container-image", "/images/hpcdp.sif", "--container-mounts", "/scratch",
            "--container-mounts", "/data:/data:ro", "--container-options=--cleanenv",
            "--env", "FI_PROVIDER=cxi", "--config", "my.toml"]
    assert cli.main(argv) == 0
    assert capsys.readouterr().out == render(**CASES["apptainer"])
    argv = ["render", "--nodes", "2", "--gpus-per-node", "8", "--srun-options=--cpu-bind=cores",
            "--container-runtime", "pyxis", "--container-image",
            "nvcr.io#nvidia/pytorch:24.05-py3", "--container-mounts", "/scratch:/scratch",
            "--container-options=--container-workdir=/scratch/run",
            "--container-options=--no-container-mount-home"]
    assert cli.main(argv) == 0
    assert capsys.readouterr().out == render(**CASES["pyxis"])
    assert cli.main(["render", "--container-image", "x.sif"]) == 2
    assert "container.runtime must be one of" in capsys.readouterr().err


def test_site_container_and_the_command_lines_runtime(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    site = tmp_path / "box.toml"
    site.write_text('[container]\nruntime = "apptainer"\nimage = "a.sif"\nmounts = ["/s"]\n')
    assert cli.main(["render", "--site", str(site), "--container-mounts", "/t"]) == 0
    assert "launch_prefix=(apptainer exec --nv --bind /s,/t a.sif)" in capsys.readouterr().out
    assert cli.main(["render", "--site", str(site), "--container-runtime", "none"]) == 0
    assert "launch_prefix=()" in capsys.readouterr().out
    assert cli.main(["render", "--site", "none", "--container-runtime", "none"]) == 0
    assert "launch_prefix=()" in capsys.readouterr().out


# ---- the batch script run, stand-ins for srun and the runtime -----------------------------


@pytest.mark.parametrize("runtime", ["apptainer", "singularity", "shifter"])
def test_prefix_runs_the_training_inside_under_srun(tmp_path: Path, runtime: str) -> None:
    box = {"runtime": runtime, "image": "img", "mounts": ["/scratch:/scratch"]}
    proc, folder = start(tmp_path, {"container": box, "env": {"FI_PROVIDER": "cxi"},
                                    "config": "my.toml"}, (runtime,))
    status, out = finish(proc)
    assert status == 0, out
    srun = recorded(folder, "srun")
    inner = Container(runtime, "img", ("/scratch:/scratch",)).prefix()
    # srun's options, then the runtime with its own, then the training command.
    command = [str(folder / "python"), "-m", "hpcdp.train", "--config", "my.toml",
               "optim.lr=0.1"]
    assert srun[srun.index(runtime):] == [*inner, *command], srun
    assert recorded(folder, runtime) == [*inner[1:], *command]
    assert recorded(folder, "python") == ["-m", "hpcdp.train", "--config", "my.toml",
                                          "optim.lr=0.1"]
    # The job's environment reaches the runtime and, through it, the command.
    assert env_of(folder, runtime)["FI_PROVIDER"] == "cxi"
    assert env_of(folder, "python")["SLURM_EXPORT_ENV"] == "ALL"


def test_pyxis_is_srun_options_and_no_prefix(tmp_path: Path) -> None:
    proc, folder = start(tmp_path, CASES["pyxis"], ())
    status, out = finish(proc)
    assert status == 0, out
    srun = recorded(folder, "srun")
    opts = srun[:srun.index(str(folder / "python"))]
    assert opts[opts.index("--kill-on-bad-exit=1"):] == [
        "--kill-on-bad-exit=1", "--cpu-bind=cores",
        "--container-image=nvcr.io#nvidia/pytorch:24.05-py3",
        "--container-mounts=/scratch:/scratch", "--container-workdir=/scratch/run",
        "--no-container-mount-home"]
    assert recorded(folder, "python")[:2] == ["-m", "hpcdp.train"]


def test_signal_reaches_the_container_and_the_host_shell_requeues(tmp_path: Path) -> None:
    """USR1 to the batch shell -> srun -> the runtime's command; its exit asking for a
    requeue is answered by the batch shell, outside the container."""
    proc, folder = start(tmp_path, {"container": APPTAINER}, ("apptainer",),
                         PY_DOES="wait-usr1")
    deadline = time.monotonic() + 30
    while not (folder / "python.started").exists():
        assert proc.poll() is None and time.monotonic() < deadline, finish(proc)[1]
        time.sleep(0.05)
    proc.send_signal(signal.SIGUSR1)  # as Slurm's --signal=B:USR1 would
    status, out = finish(proc)
    assert "batch shell got USR1; passing it to the ranks" in out
    assert (folder / "srun.signals").read_text().split() == ["USR1"]
    assert (folder / "python.signals").read_text().split() == ["USR1"]
    assert f"ranks finished with exit status {EXIT_REQUEUE}" in out
    assert (folder / "requeued").read_text().split() == ["41"]
    assert status == 0 and "requeued job 41 from the batch shell" in out, out


def test_missing_runtime_stops_before_srun(tmp_path: Path) -> None:
    if shutil.which("apptainer", path="/usr/bin:/bin"):
        pytest.skip("a real apptainer is installed")
    proc, folder = start(tmp_path, {"container": APPTAINER}, (), SLURMD_NODENAME="node7")
    status, out = finish(proc)
    assert status == 2, out
    assert "error: container runtime apptainer not found on node7" in out
    assert not (folder / "srun.args").exists()
