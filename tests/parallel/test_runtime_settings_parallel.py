"""hpcdp's runtime settings under the README's plain launch commands, nothing exported.

The training applies threads and MPI yielding itself (hpcdp.runtime.dist.init, before
hvd.init); each rank's identity line says what it runs with: torch's own thread
count, the yielding that reached MPI, and why.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from hpcdp.runtime import hvd_settings, thread_plan
from hpcdp.runtime.cpus import probe
from hpcdp.runtime.launcher import run_ranks

pytestmark = pytest.mark.parallel

TRAIN = [sys.executable, "-m", "hpcdp.train"]


def identities(output: str) -> list[dict]:
    return [json.loads(m) for m in re.findall(r"hpcdp-rank (\{[^{}]*\})", output)]


def train_plain(make_data, tmp_path: Path, launcher: str, env: dict[str, str] | None = None):
    data = make_data(64, 32)
    argv = [*TRAIN, f"data.path={data}", f"run.dir={tmp_path / 'run'}", "data.batch_size=16",
            "data.val_batch_size=16", "run.epochs=1", "log.tensorboard=false",
            "checkpoint.every_steps=0"]
    run = run_ranks(argv, np=2, launcher=launcher, timeout=120, env=env, cwd=tmp_path,
                    plain=True)
    assert run.ok, run.describe()
    ids = identities(run.output)
    assert sorted(i["rank"] for i in ids) == [0, 1], run.describe()
    return ids


@pytest.mark.parametrize("launcher", ["horovodrun", "mpirun"])
def test_plain_launch_gets_the_rule(make_data, tmp_path: Path, launcher: str) -> None:
    ids = train_plain(make_data, tmp_path, launcher)
    view = probe()
    for ident in ids:
        if launcher == "horovodrun":  # -bind-to none: both ranks share this process's CPUs
            plan = thread_plan.plan_runtime(view, 2, {"OMPI_COMM_WORLD_LOCAL_SIZE": "2"})
            assert ident["threads"] == plan.threads, ident
            assert ident["mpi_yield"] is plan.yield_idle, ident
            assert ident["settings"].startswith(plan.describe()), ident
        else:  # plain mpirun binds each of 2 ranks to a core of its own
            assert "bound to this rank" in ident["settings"], ident
        if len(view.affinity) == 2:  # this machine's case: 2 ranks on 2 cores
            assert (ident["threads"], ident["mpi_yield"]) == (1, True), ident
        # The patched Horovod `make setup` builds: CPU training wakes it on enqueue, and
        # its cycle then only paces idle negotiations (hvd_settings.cycle_env); a stock
        # or site build sleeps out Horovod's own 1 ms cycle.
        if hvd_settings.horovod_wakes():
            assert ident["settings"].endswith("fusion 1 MiB, wake on enqueue, cycle 50 ms"), ident
        else:
            assert ident["settings"].endswith(
                "fusion 1 MiB, cycle 1 ms slept out (Horovod without hpcdp's patch)"), ident


def test_exported_values_win(make_data, tmp_path: Path) -> None:
    ids = train_plain(make_data, tmp_path, "horovodrun",
                      env={"OMP_NUM_THREADS": "2", thread_plan.YIELD_VAR: "0"})
    for ident in ids:
        assert (ident["threads"], ident["mpi_yield"]) == (2, False), ident
        assert ident["settings"].startswith(
            "threads 2 (OMP_NUM_THREADS exported), yield off (OMPI_MCA_mpi_yield_when_idle "
            "exported)"), ident


def test_a_malformed_export_fails_every_rank_cleanly(make_data, tmp_path: Path) -> None:
    data = make_data(64, 32)
    argv = [*TRAIN, f"data.path={data}", f"run.dir={tmp_path / 'run'}"]
    run = run_ranks(argv, np=2, launcher="horovodrun", timeout=120, cwd=tmp_path, plain=True,
                    env={"OMP_NUM_THREADS": "lots"})
    assert run.returncode != 0 and not run.timed_out, run.describe()
    assert run.output.count("OMP_NUM_THREADS='lots' is not a positive whole number") == 2, \
        run.describe()
