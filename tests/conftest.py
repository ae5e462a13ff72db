"""Shared fixtures: bounded multi-rank runs under a real launcher."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import pytest

from hpcdp.runtime.launcher import RankRun, run_ranks

REPO = Path(__file__).resolve().parent.parent
WORKERS = Path(__file__).resolve().parent / "parallel" / "workers"

RanksFn = Callable[..., RankRun]


@pytest.fixture
def ranks(tmp_path: Path) -> RanksFn:
    """Run a worker script (tests/parallel/workers/NAME.py) or a module on several ranks.

    `ranks("hvd_ops", np=2)` runs the worker under mpirun and fails the test,
    with every rank's output, unless all ranks exit 0 within the bound.
    Pass `expect_ok=False` to inspect a failing run yourself.
    """

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
        run = run_ranks(argv, np=np, launcher=launcher, timeout=timeout, env=env, cwd=tmp_path)
        if expect_ok:
            assert run.ok, run.describe()
        return run

    return _run


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
