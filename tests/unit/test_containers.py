"""Containers: launch prefixes and pyxis options, their goldens, and the batch script run.

No container runtime is installed here, so the rendered script runs under bash with
stand-ins first on PATH: `srun` and `apptainer`/`singularity`/`shifter` record their
arguments and environment and then run what they were given, as the real ones do;
the training command is a stand-in `python` (HPCDP_PYTHON) that exits or waits for a
signal as a test arranges. What a real runtime does with an image is not tested.
The host's `python3`, which works out the layout, is this interpreter made unable to
import hpcdp (-I -S: no PYTHONPATH, current folder or site-packages), as on a host
where hpcdp lives in the image alone.
Regenerate the goldens with `HPCDP_UPDATE_GOLDEN=1 python -m pytest
tests/unit/test_containers.py`.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from test_sbatch_launch import SCONTROL
from test_slurm_layout import CASES as LAYOUTS
from test_slurm_render import GOLDEN, check_golden

from hpcdp.cluster import cli, containers, layout
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
# The host's python3: a real interpreter that cannot import hpcdp, whatever it is asked.
HOST_PYTHON3 = f"""#!/bin/bash
exec {sys.executable} -I -S "$@"
"""


def standins(tmp_path: Path, runtimes: tuple[str, ...]) -> Path:
    folder = tmp_path / "bin"
    folder.mkdir(exist_ok=True)
    scripts = {"srun": SRUN, "scontrol": SCONTROL, "python": PYTHON, "python3": HOST_PYTHON3,
               **dict.fromkeys(runtimes, RUNTIME)}
    for name, text in scripts.items():
        (folder / name).write_text(text)
        (folder / name).chmod(0o755)
    return folder


def job_env(folder: Path, **extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("SLURM_", "OMP_", "MKL_", "HPCDP_"))}
    # Only the stand-ins (python3 among them: the host's, without hpcdp) and the system's
    # tools: no real runtime can be picked up.
    path = os.pathsep.join((str(folder), "/usr/bin:/bin"))
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


# ---- the layout on a host without hpcdp ----------------------------------------------------


def host_python3(tmp_path: Path) -> Path:
    """The stand-ins' python3, checked: it runs, and it cannot import hpcdp."""
    python3 = standins(tmp_path, ()) / "python3"
    done = subprocess.run([str(python3), "-c", "import hpcdp"], cwd=tmp_path, env=os.environ,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1 and "No module named 'hpcdp'" in done.stderr, done.stderr
    return python3


def carried_program(script: str) -> str:
    """The Python program the batch script gives the host's python3 for the layout."""
    m = re.search(r"<<'HPCDP_LAYOUT'\n(.*?\n)HPCDP_LAYOUT\n", script, re.DOTALL)
    assert m, "no carried layout in the script"
    return m[1]


def _stamp(text: str) -> str:
    return re.sub(r"\[hpcdp\.sbatch \d\d:\d\d:\d\d\]", "[hpcdp.sbatch T]", text)


@pytest.mark.parametrize("environ", [case[0] for case in LAYOUTS] + [
    {"SLURM_GPUS_ON_NODE": "4", "SLURM_NTASKS_PER_NODE": "2"},
    {"SLURM_NTASKS": "4", "SLURM_TASKS_PER_NODE": "2(x0)"}])
def test_the_carried_layout_gives_the_modules_on_a_python_without_hpcdp(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], environ: dict[str, str]) -> None:
    """Every allocation of test_slurm_layout, and two it refuses: the same output, warning,
    error and exit status as `python -m hpcdp.cluster.layout`."""
    python3 = host_python3(tmp_path)
    program = carried_program(render(container=APPTAINER))
    done = subprocess.run([str(python3), "-I", "-"], input=program, cwd=tmp_path,
                          env={"PATH": "/usr/bin:/bin", **environ}, capture_output=True,
                          text=True, timeout=60, check=False)
    status = layout.main([], environ)
    out, err = capsys.readouterr()
    assert (done.returncode, done.stdout, _stamp(done.stderr)) == (status, out, _stamp(err))


def test_pyxis_and_prefixes_carry_the_layout_a_plain_job_runs_the_module() -> None:
    for name in sorted(CASES):
        assert "<<'HPCDP_LAYOUT'" in render(**CASES[name]), name
    assert "<<'HPCDP_LAYOUT'" in render(srun_options=["--container-image=repo#img"])
    plain = render()
    assert "HPCDP_LAYOUT" not in plain
    assert 'layout_out="$("$layout_python" -m hpcdp.cluster.layout)"' in plain


def test_the_carried_program_reads_as_python_3_7() -> None:
    """The floor docs/slurm-sites.md gives for the host's python3 (syntax alone: a newer
    library call would pass here)."""
    program = carried_program(render(container=APPTAINER))
    sources = re.findall(r"r'''(.*?)'''", program, re.DOTALL)
    assert len(sources) == 2
    for text in (program, *sources):
        ast.parse(text, feature_version=(3, 7))


def test_a_host_without_a_usable_python3_is_named(tmp_path: Path) -> None:
    proc, folder = start(tmp_path, {"container": APPTAINER}, ("apptainer",),
                         HPCDP_BATCH_PYTHON="no-such-python")
    status, out = finish(proc)
    assert status == 127, out
    assert ("error: no-such-python, running hpcdp.cluster.layout as this script carries it, "
            "failed (exit status 127): the batch shell needs a python3 of 3.7 or later") in out
    assert not (folder / "srun.args").exists()


def test_the_container_job_lays_out_the_allocation(tmp_path: Path) -> None:
    """The whole script on a fake allocation of 2 nodes with 2 GPUs each: srun gets the
    module's layout, worked out by the host's python3 without hpcdp."""
    allocation = {"SLURM_JOB_NUM_NODES": "2", "SLURM_GPUS_ON_NODE": "2",
                  "SLURM_GPUS_PER_NODE": "2", "SLURM_JOB_CPUS_PER_NODE": "8(x2)"}
    host_python3(tmp_path)
    proc, folder = start(tmp_path, {"container": APPTAINER}, ("apptainer",), **allocation)
    status, out = finish(proc)
    assert status == 0, out
    srun = recorded(folder, "srun")
    assert srun[:3] == layout.plan(allocation).srun_options() == [
        "--ntasks=4", "--ntasks-per-node=2", "--cpus-per-task=4"], srun
    assert "4 ranks, 2 node(s), 2 GPU(s)/node, 4 CPU(s)/rank" in out
