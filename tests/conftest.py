"""Shared fixtures: bounded multi-rank runs under a real launcher; small HDF5 files."""

from __future__ import annotations

import compileall
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import h5py
import numpy as np
import pytest

from hpcdp.runtime.launcher import RankRun, rank_environment, run_ranks

REPO = Path(__file__).resolve().parent.parent
WORKERS = Path(__file__).resolve().parent / "parallel" / "workers"

RanksFn = Callable[..., RankRun]

#: Open MPI's PML for every rank the tests start: the one Open MPI selects here anyway
#: (the system's defaults exclude UCX), named so that MPI_Init opens no other. Left to
#: choose, each rank's MPI_Init also opens the `cm` PML and its PSM/PSM2 transports, only
#: to find no such hardware: about 0.2 s of every rank's start, hundreds of times a suite.
#: A value exported before the session wins; jobs on the local Slurm cluster drop every
#: OMPI_* variable (tests/slurm/conftest.py) and choose as a site's would.
TEST_PML = "ob1"


def pytest_sessionstart(session: pytest.Session) -> None:
    """Start-up cost of the hundreds of Python processes the suite starts (ranks, recipes,
    `hpcdp` commands, workers): hpcdp's bytecode is written once, here. Where
    PYTHONDONTWRITEBYTECODE is set, as on the project's machines, no process writes it,
    and each one compiled every hpcdp module it imports from source again (0.3-0.4 s of
    CPU for a training rank). Python reads the files even so, and recompiles any module
    whose source changed since."""
    compileall.compile_dir(REPO / "hpcdp", quiet=1)
    os.environ.setdefault("OMPI_MCA_pml", TEST_PML)
    if os.environ.get("HPCDP_TEST_ZYGOTE", "1") != "0" and not _xdist_controller(session):
        _start_zygotes()


#: tests/zygote: the pre-imported servers the ranks fork from, and the start-up hook.
ZYGOTE_DIR = Path(__file__).resolve().parent / "zygote"
#: Servers per session: a rank's number picks one, and each has a hash seed of its own.
ZYGOTES = 2
_zygotes: list[subprocess.Popen] = []


def _xdist_controller(session: pytest.Session) -> bool:
    """Whether this process only hands tests to pytest-xdist workers (it runs none)."""
    workers = getattr(session.config.option, "numprocesses", None)
    return bool(workers) and not hasattr(session.config, "workerinput")


def _start_zygotes() -> None:
    """Start tests/zygote's servers with the environment the ranks get (two ranks) and
    point every Python the tests start at them; a rank that finds none ready, or is
    refused, starts as usual."""
    folder = tempfile.mkdtemp(prefix="hpcdp-zygote-")
    env = rank_environment(None, np=2)
    seeds = random.Random().sample(range(1, 2**31), ZYGOTES)
    sockets = [os.path.join(folder, f"{i}.sock") for i in range(ZYGOTES)]
    for path, seed in zip(sockets, seeds):
        with open(path + ".log", "wb") as log:
            _zygotes.append(subprocess.Popen(
                [sys.executable, str(ZYGOTE_DIR / "server.py"), path],
                env={**env, "PYTHONHASHSEED": str(seed)}, stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=log, cwd=folder))
    os.environ["HPCDP_ZYGOTE"] = ",".join(sockets)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ZYGOTE_DIR), os.environ.get("PYTHONPATH", "")) if p)
    _zygotes_folder.append(folder)


_zygotes_folder: list[str] = []


def pytest_sessionfinish(session: pytest.Session) -> None:
    for server in _zygotes:
        server.terminate()
    deadline = time.monotonic() + 10
    for server in _zygotes:
        try:
            server.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            server.kill()
    for folder in _zygotes_folder:
        shutil.rmtree(folder, ignore_errors=True)


#: The node id prefix of the tests that use the local Slurm cluster (ids are relative to
#: the repository, pytest's rootdir).
SLURM_PREFIX = "tests/slurm/"


def work_unit(nodeid: str) -> str:
    """The pytest-xdist work unit a test belongs to: one unit for every Slurm test, so one
    worker and one local cluster run them all (a second cluster would number its jobs from
    1 as well, and a job's leftover ranks are found by SLURM_JOB_ID host-wide); each other
    test is a unit of its own."""
    return "slurm" if nodeid.startswith(SLURM_PREFIX) else nodeid


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """make test's scheduler under pytest-xdist: `work_unit` decides what shares a worker.
    It groups by node id, not by `xdist_group` marks, because pytest-xdist 3.8 applies a
    mark by rewriting `item._nodeid`, which pytest 9.2's items no longer read."""
    from xdist.scheduler import LoadScopeScheduling

    class SlurmTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return SlurmTogether(config, log)


def ranks_in(cwd: Path) -> RanksFn:
    """The `ranks` runner with its ranks started in `cwd` (see the `ranks` fixture)."""

    def _run(
        worker: str | Sequence[str],
        *args: str,
        np: int = 2,
        launcher: str = "mpirun",
        timeout: float = 120.0,
        env: Mapping[str, str] | None = None,
        expect_ok: bool = True,
    ) -> RankRun:
        if isinstance(worker, str):
            argv = [sys.executable, str(WORKERS / f"{worker}.py"), *args]
        else:
            argv = [*worker, *args]
        run = run_ranks(argv, np=np, launcher=launcher, timeout=timeout, env=env, cwd=cwd)
        if expect_ok:
            assert run.ok, run.describe()
        return run

    return _run


@pytest.fixture
def ranks(tmp_path: Path) -> RanksFn:
    """Run a worker script (tests/parallel/workers/NAME.py) or a module on several ranks.

    `ranks("hvd_ops", np=2)` runs the worker under mpirun and fails the test,
    with every rank's output, unless all ranks exit 0 within the bound.
    Pass `expect_ok=False` to inspect a failing run yourself.
    """
    return ranks_in(tmp_path)


@pytest.fixture(scope="module")
def module_ranks(tmp_path_factory: pytest.TempPathFactory) -> RanksFn:
    """`ranks` for a module-scoped fixture: one expensive run (a training, a compile)
    shared by the tests that check its outputs instead of repeated by each."""
    return ranks_in(tmp_path_factory.mktemp("ranks"))


@pytest.fixture(autouse=True)
def _restore_environment():
    """Each test starts from the environment the session started with.

    Code under test may write hpcdp's runtime settings into os.environ (prep and
    dist.init apply them in-process, as they must before MPI starts); left there,
    they would read as exported values to every later test's ranks.
    """
    import os

    saved = dict(os.environ)
    yield
    for key in set(os.environ) - set(saved):
        del os.environ[key]
    os.environ.update(saved)


def write_samples(path: Path, n: int, chunk: int | None = 16, x_name: str = "x",
                  y_name: str = "y", dtype: str = "float32") -> Path:
    """x[i] = (i, -i) (or i % 251 for uint8) and y[i] = i: every sample names itself."""
    with h5py.File(path, "w") as f:
        if dtype == "uint8":
            x = (np.arange(n)[:, None, None] % 251 * np.ones((1, 2, 3))).astype(np.uint8)
        else:
            x = np.stack([np.arange(n), -np.arange(n)], axis=1).astype(dtype)
        f.create_dataset(x_name, data=x, chunks=(chunk, *x.shape[1:]) if chunk else None)
        f.create_dataset(y_name, data=np.arange(n, dtype=np.int64),
                         chunks=(chunk,) if chunk else None)
    return path


def write_fields(path: Path, n: int = 1000, chunks: tuple[int, int, int] = (16, 16, 16)) -> Path:
    """Every field names its row: dense (i, -i), sparse (i, 2i, 3i), label i % 2."""
    i = np.arange(n)
    with h5py.File(path, "w") as f:
        f.create_dataset("dense", data=np.stack([i, -i], 1).astype(np.float32),
                         chunks=(chunks[0], 2))
        f.create_dataset("sparse", data=np.stack([i, 2 * i, 3 * i], 1).astype(np.int32),
                         chunks=(chunks[1], 3))
        f.create_dataset("label", data=(i % 2).astype(np.uint8), chunks=(chunks[2],))
    return path


@pytest.fixture
def samples_file() -> Callable[..., Path]:
    """`samples_file(path, n, chunk=16, x_name, y_name, dtype)`: an image-reader file
    whose every sample names itself (write_samples)."""
    return write_samples


@pytest.fixture
def fields_file() -> Callable[..., Path]:
    """`fields_file(path, n=1000, chunks=(16, 16, 16))`: a field-reader file whose every
    row names itself (write_fields)."""
    return write_fields
