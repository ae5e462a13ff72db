"""The local two-node Slurm cluster, started once per test session, and job helpers.

Every wait is bounded; a job that does not reach the expected state fails the
test with its `scontrol` record and its output file. The cluster's daemons are
stopped at the end of the session, also when tests fail.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
#: The venv the tests run in (make test's VENV), which the jobs on the local cluster use.
VENV = Path(sys.prefix)
TRAIN_SBATCH = REPO / "slurm" / "train.sbatch"
PREP_SBATCH = REPO / "slurm" / "prep.sbatch"
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
            "BOOT_FAIL", "DEADLINE", "PREEMPTED"}


def _cluster_module() -> ModuleType:
    path = REPO / "slurm" / "localcluster" / "cluster.py"
    spec = importlib.util.spec_from_file_location("hpcdp_localcluster", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclass
class Job:
    """A submitted job: its id and the cluster that runs it."""

    id: str
    cluster: Cluster
    cwd: Path

    def info(self) -> dict[str, str]:
        return self.cluster.job_info(self.id)

    @property
    def output_path(self) -> Path:
        return Path(self.info()["StdOut"])

    def output(self) -> str:
        try:
            return self.output_path.read_text(errors="replace")
        except OSError as e:
            return f"(no output file: {e})"

    def rank_lines(self) -> list[dict[str, object]]:
        """The `hpcdp-rank {json}` lines the training printed, one per rank and run."""
        found = []
        for line in self.output().splitlines():
            _, sep, rest = line.partition("hpcdp-rank ")
            if sep and rest.startswith("{"):
                found.append(json.loads(rest))
        return found

    def describe(self) -> str:
        info = self.info()
        keys = ("JobState", "Reason", "ExitCode", "Restarts", "NodeList", "StdOut")
        head = " ".join(f"{k}={info.get(k)}" for k in keys)
        return f"job {self.id}: {head}\n--- output ---\n{self.output()}"

    def wait(self, timeout: float, states: Sequence[str] = ("COMPLETED",)) -> dict[str, str]:
        """Wait (bounded) until the job is in a terminal state; fail unless it is in `states`."""
        deadline = time.monotonic() + timeout
        info = self.info()
        while info.get("JobState") not in TERMINAL and time.monotonic() < deadline:
            time.sleep(0.5)
            info = self.info()
        state = info.get("JobState")
        if state not in TERMINAL:
            pytest.fail(f"job {self.id} still {state} after {timeout:.0f}s\n{self.describe()}")
        assert state in states, f"expected {'/'.join(states)}\n{self.describe()}"
        return info

    def wait_for(self, what: str, predicate: Callable[[], bool], timeout: float) -> None:
        """Wait (bounded) until `predicate()` holds; fail if the job ends without it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            if self.info().get("JobState") in TERMINAL:
                if predicate():
                    return
                pytest.fail(f"job {self.id} ended before {what}\n{self.describe()}")
            time.sleep(0.2)
        pytest.fail(f"no {what} within {timeout:.0f}s\n{self.describe()}")

    def wait_for_step(self, run_dir: Path, step: int, timeout: float = 180) -> None:
        """Wait (bounded) until the run in `run_dir` has logged training step `step`."""
        self.wait_for(f"training progress (step >= {step} in metrics.jsonl)",
                      lambda: any(s >= step for s in logged_steps(run_dir)), timeout)

    def leftover_processes(self, timeout: float = 15.0) -> list[str]:
        """Processes still carrying this job's id in their environment, after `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            found = processes_of_job(self.id)
            if not found or time.monotonic() > deadline:
                return found
            time.sleep(0.3)


def logged_steps(run_dir: Path) -> list[int]:
    """The training steps `run_dir/metrics.jsonl` holds so far (a line being written is
    skipped)."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    steps = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line being written
        if record.get("kind") == "train":
            steps.append(int(record["step"]))
    return steps


def processes_of_job(job_id: str) -> list[str]:
    """`pid: command` of every process whose environment says SLURM_JOB_ID=job_id."""
    marker = f"SLURM_JOB_ID={job_id}".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
            if marker in environ:
                cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                found.append(f"{proc.name}: {cmd}")
        except OSError:
            continue
    return found


@dataclass
class Cluster:
    """Client side of the running local cluster."""

    root: Path
    env: dict[str, str]
    jobs: list[Job] = field(default_factory=list)

    def run(self, *cmd: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(cmd), env=self.env, capture_output=True, text=True,
                              timeout=timeout, check=False)

    def job_env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """What sbatch exports to a job: this checkout's venv, nothing leaking from pytest."""
        env = {k: v for k, v in self.env.items()
               if not k.startswith(("SLURM_", "OMPI_", "PMIX_", "HOROVOD_", "PYTEST_"))}
        env["SLURM_CONF"] = self.env["SLURM_CONF"]
        env["HPCDP_VENV"] = str(VENV)
        env.pop("VIRTUAL_ENV", None)
        # The test nodes share two cores, and every rank sees both (no CPU binding):
        # one thread per rank keeps the jobs quick on a loaded machine.
        env.setdefault("OMP_NUM_THREADS", "1")
        if extra:
            env.update(extra)
        return env

    def sbatch(self, *args: str, cwd: Path, env: Mapping[str, str] | None = None) -> Job:
        done = subprocess.run(["sbatch", "--parsable", *args], env=self.job_env(env), cwd=cwd,
                              capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, f"sbatch {' '.join(args)} failed:\n{done.stderr}"
        job = Job(done.stdout.strip().split(";")[0], self, cwd)
        self.jobs.append(job)
        return job

    def job(self, job_id: str, cwd: Path) -> Job:
        """A job submitted some other way (e.g. `hpcdp slurm submit`)."""
        job = Job(job_id, self, cwd)
        self.jobs.append(job)
        return job

    def job_info(self, job_id: str) -> dict[str, str]:
        done = self.run("scontrol", "show", "job", "-o", job_id)
        assert done.returncode == 0, f"scontrol show job {job_id}: {done.stderr}"
        info: dict[str, str] = {}
        for item in done.stdout.split():
            key, sep, value = item.partition("=")
            if sep and key not in info:
                info[key] = value
        return info


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[Cluster]:
    """Start the cluster once; stop its daemons at the end of the session, whatever happened."""
    module = _cluster_module()
    why = module.missing_requirements()
    if why:
        pytest.skip(why)
    if not (VENV / "bin" / "python").exists():
        pytest.skip(f"no venv at {VENV} (run the setup first)")
    # Under /tmp, not pytest's private tmp: MUNGE wants its socket's folder searchable by all.
    root = Path(tempfile.mkdtemp(prefix="hpcdp-slurm-"))
    try:
        env = module.start(root)
    except module.ClusterError as e:
        module.stop(root)
        shutil.rmtree(root, ignore_errors=True)
        pytest.fail(f"local Slurm cluster did not start: {e}")
    cluster = Cluster(root, env)
    try:
        yield cluster
    finally:
        module.stop(root)
        if os.environ.get("HPCDP_KEEP_CLUSTER") != "1":
            shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def digits(slurm_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> tuple[Job, Path]:
    """The digits data: `sbatch --ntasks=2 slurm/prep.sbatch datasets/digits.py --out DIR`."""
    where = tmp_path_factory.mktemp("digits")
    recipe = REPO / "datasets" / "digits.py"
    job = slurm_cluster.sbatch("--ntasks=2", str(PREP_SBATCH), str(recipe), "--out",
                               str(where / "data"), cwd=where)
    job.wait(timeout=120)
    return job, where / "data"
