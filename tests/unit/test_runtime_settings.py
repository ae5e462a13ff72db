"""hpcdp's thread and yielding rule over CPU counts, ranks per node, masks and quotas (pure),
and the reading of affinity, cpusets and cgroup quotas from a cgroup tree on disk."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcdp.runtime import cpus, hvd_settings, thread_plan
from hpcdp.runtime.cpus import CpuView
from hpcdp.runtime.thread_plan import YIELD_VAR, local_ranks, plan_runtime


def view(mask: range | set[int], pool: range | set[int] | None = None,
         quota: float | None = None) -> CpuView:
    mask = frozenset(mask)
    return CpuView(mask, frozenset(pool) if pool is not None else mask, quota)


# --------------------------------------------------------------------------- the rule


@pytest.mark.parametrize(("ncpus", "ranks", "threads", "yields"), [
    (2, 2, 1, True),     # this machine: 2 ranks on 2 cores, the case
    (2, 1, 2, False),    # one process alone keeps both cores
    (4, 2, 2, False),    # 4 busy threads on 4 CPUs: no yielding
    (3, 2, 1, True),     # 1.5 CPUs each: one thread, and yielding
    (2, 4, 1, True),     # more ranks than CPUs: at least 1 thread
    (64, 8, 8, False),   # one rank per GPU on a 64-core node: 8 threads, not 1
    (128, 4, 32, False),
])
def test_threads_are_the_shared_cpus_over_the_ranks(ncpus, ranks, threads, yields) -> None:
    plan = plan_runtime(view(range(ncpus)), ranks, {})
    assert plan.threads == threads
    assert plan.yield_idle is yields
    assert plan.env["OMP_NUM_THREADS"] == plan.env["MKL_NUM_THREADS"] == str(threads)
    assert (YIELD_VAR in plan.env) is yields
    assert plan.sharers == ranks
    assert plan.oversubscribed is (ranks > ncpus)  # only when ranks alone outnumber CPUs


def test_describe_says_why() -> None:
    plan = plan_runtime(view(range(2)), 2, {})
    assert plan.describe() == ("threads 1 (2 CPUs / 2 local ranks), "
                               "yield on (4 busy threads > 2 CPUs)")
    alone = plan_runtime(view(range(16)), 1, {})
    assert alone.describe() == "threads 16 (16 CPUs), yield off (2 busy threads <= 16 CPUs)"


MPIRUN = {"OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
MPIRUN_BOUND = {**MPIRUN, "OMPI_MCA_orte_bound_at_launch": "1"}


def test_a_rank_bound_to_its_own_cpus_gets_its_whole_mask() -> None:
    # Plain mpirun -np 2 on this machine: each rank bound to one core of two.
    plan = plan_runtime(view({1}, pool=range(2)), 2, MPIRUN_BOUND)
    assert (plan.threads, plan.sharers, plan.yield_idle) == (1, 1, True)
    assert plan.threads_why == "1 CPU bound to this rank"
    assert plan.yield_why == "2 busy threads > 1 CPU"
    # srun --cpu-bind on a 64-core node, 8 ranks of 8 cores: 8 each, and no yielding.
    srun = {"SLURM_STEP_ID": "0", "SLURM_CPU_BIND_TYPE": "mask_cpu:"}
    assert plan_runtime(view(range(8, 16), pool=range(64)), 8,
                        {**srun, "SLURM_CPU_BIND_TYPE": "none"}).threads == 1  # said: shared
    bound8 = plan_runtime(view(range(8, 16), pool=range(64)), 8, srun)
    assert (bound8.threads, bound8.sharers, bound8.yield_idle) == (8, 1, False)
    # Whole sockets for 2 ranks: each keeps its 32 cores, not 32 / 2.
    assert plan_runtime(view(range(32), pool=range(64)), 2, MPIRUN_BOUND).threads == 32


def test_a_job_narrowed_as_a_whole_shares_its_mask() -> None:
    # taskset -c 0,1 around a job on a 16-core node: both ranks have {0, 1}. Where the
    # launcher says it did not bind, the ranks share the mask.
    narrowed = view({0, 1}, pool=range(16))
    for launcher in ({"HOROVOD_LOCAL_SIZE": "2"},
                     {"SLURM_STEP_ID": "0", "SLURM_CPU_BIND_TYPE": "none"}):
        plan = plan_runtime(narrowed, 2, launcher)
        assert (plan.threads, plan.sharers, plan.yield_idle) == (1, 2, True), launcher
    # Where it does not say (srun's default binding, other MPIs), the masks are the
    # ranks' own when that many disjoint ones fit in the cpuset...
    assert plan_runtime(view(range(8, 16), pool=range(64)), 8, {"SLURM_STEP_ID": "0"}
                        ).threads == 8
    assert plan_runtime(view(range(4), pool=range(16)), 4, {}).sharers == 1
    # ...and shared when they cannot be disjoint.
    assert plan_runtime(view(range(8), pool=range(16)), 4, MPIRUN).sharers == 4
    # taskset around one process: its mask is its own.
    assert plan_runtime(view({3}, pool=range(16)), 1, {}).threads_why == "1 CPU bound to this rank"


def test_unbound_ranks_in_a_narrow_cpuset_share_it() -> None:
    # A Slurm step confined to 8 CPUs of 64 (cgroup cpuset), no binding: 4 ranks share them.
    plan = plan_runtime(view(range(8), pool=range(8)), 4, {})
    assert (plan.threads, plan.sharers, plan.cpus) == (2, 4, 8.0)
    assert plan.threads_why == "8 CPUs / 4 local ranks"


def test_a_cgroup_quota_limits_the_cpus() -> None:
    # A container that sees 16 CPUs but may use 2 of them: 2 ranks get 1 thread each.
    plan = plan_runtime(view(range(16), quota=2.0), 2, {})
    assert (plan.threads, plan.cpus, plan.yield_idle) == (1, 2.0, True)
    assert plan.threads_why == "cgroup quota 2 CPUs / 2 local ranks"
    # A fractional quota still gives at least one thread.
    assert plan_runtime(view(range(16), quota=0.5), 1, {}).threads == 1
    # Bound ranks split the quota too: 4 ranks bound to 4 cores each, 8 CPUs in all.
    bound = plan_runtime(view(range(4), pool=range(16), quota=8.0), 4, MPIRUN_BOUND)
    assert (bound.threads, bound.cpus, bound.sharers) == (2, 2.0, 1)
    # A quota above the mask changes nothing.
    assert plan_runtime(view(range(4), quota=32.0), 2, {}).threads_why == "4 CPUs / 2 local ranks"


def test_exported_values_win() -> None:
    plan = plan_runtime(view(range(2)), 2, {"OMP_NUM_THREADS": "2", YIELD_VAR: "0"})
    assert (plan.threads, plan.yield_idle) == (2, False)
    assert plan.env == {"MKL_NUM_THREADS": "2"}  # only what was not exported
    assert plan.oversubscribed  # 2 ranks x 2 threads on 2 CPUs
    assert "exported" in plan.threads_why and "exported" in plan.yield_why
    assert plan_runtime(view(range(64)), 8, {"OMP_NUM_THREADS": "4,2"}).threads == 4
    both = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "3", YIELD_VAR: "1"}
    assert plan_runtime(view(range(2)), 2, both).env == {}
    for bad in ("0", "many", ""):
        with pytest.raises(ValueError, match="OMP_NUM_THREADS"):
            plan_runtime(view(range(2)), 2, {"OMP_NUM_THREADS": bad})


def test_apply_sets_only_what_is_missing() -> None:
    environ = {"OMPI_COMM_WORLD_LOCAL_SIZE": "2", "OMP_NUM_THREADS": "1"}
    plan = thread_plan.apply(environ, view=view(range(2)))
    assert plan.describe().startswith("threads 1 (OMP_NUM_THREADS exported), yield on")
    assert environ == {"OMPI_COMM_WORLD_LOCAL_SIZE": "2", "OMP_NUM_THREADS": "1",
                       "MKL_NUM_THREADS": "1", YIELD_VAR: "1"}


def test_rethread_for_a_local_size_learnt_at_init() -> None:
    # An unknown launcher: 1 rank assumed, Horovod then says 4 share the 8 CPUs.
    plan = plan_runtime(view(range(8)), 1, {})
    environ = dict(plan.env)
    again = thread_plan.rethread(plan, 4, environ, view=view(range(8)))
    assert (again.threads, again.sharers, again.local_ranks) == (2, 4, 4)
    assert again.env["OMP_NUM_THREADS"] == again.env["MKL_NUM_THREADS"] == "2"
    assert (again.yield_idle, again.yield_why) == (plan.yield_idle, plan.yield_why)
    exported = plan_runtime(view(range(8)), 1, {"OMP_NUM_THREADS": "3"})
    assert thread_plan.rethread(exported, 4, {"OMP_NUM_THREADS": "3"},
                                 view=view(range(8))) == exported


def test_recommended_env_for_launchers() -> None:
    # The switches of the Gloo patches this Horovod build has (none on a stock build).
    build = hvd_settings.gloo_env({}, hvd_settings.horovod_patches())
    two = hvd_settings.recommended_env(view=view(range(2)))
    assert two == {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", YIELD_VAR: "1", **build}
    wide = hvd_settings.recommended_env({"HOROVOD_CYCLE_TIME": 2}, ranks=4, view=view(range(64)))
    assert wide == {"HOROVOD_CYCLE_TIME": "2", "OMP_NUM_THREADS": "16", "MKL_NUM_THREADS": "16",
                    **build}


# --------------------------------------------------------------------------- local ranks


def test_local_ranks_from_each_launcher() -> None:
    assert local_ranks({}) == 1
    assert local_ranks({"OMPI_COMM_WORLD_LOCAL_SIZE": "4"}) == 4  # mpirun, horovodrun
    assert local_ranks({"HOROVOD_LOCAL_SIZE": "3"}) == 3  # horovodrun --gloo
    assert local_ranks({"MPI_LOCALNRANKS": "2"}) == 2  # hydra
    step = {"SLURM_STEP_ID": "0", "SLURM_STEP_TASKS_PER_NODE": "4(x2),1"}
    assert local_ranks({**step, "SLURM_NODEID": "1"}) == 4
    assert local_ranks({**step, "SLURM_NODEID": "2"}) == 1
    assert local_ranks({**step, "SLURM_NODEID": "7"}) == 4  # a node outside the list
    assert local_ranks({"SLURM_STEP_ID": "0", "SLURM_NTASKS_PER_NODE": "8"}) == 8
    # The batch script's own shell is one process whatever --ntasks-per-node says.
    assert local_ranks({"SLURM_NTASKS_PER_NODE": "8"}) == 1
    with pytest.raises(ValueError, match="tasks per node"):
        local_ranks({"SLURM_STEP_TASKS_PER_NODE": "x(2)"})


# --------------------------------------------------------------------------- reading the kernel


def test_parsers() -> None:
    assert cpus.parse_cpu_list("0-3,8,10-11\n") == frozenset({0, 1, 2, 3, 8, 10, 11})
    assert cpus.parse_cpu_list("") == frozenset()
    for bad in ("a-b", "3-1"):
        with pytest.raises(ValueError, match="CPU list"):
            cpus.parse_cpu_list(bad)
    assert cpus.parse_cpu_max("150000 100000\n") == 1.5
    assert cpus.parse_cpu_max("max 100000") is None
    assert cpus.parse_cfs_quota("-1", "100000") is None
    assert cpus.parse_cfs_quota("200000", "100000") == 2.0
    text = "12:cpu,cpuacct:/job/1\n3:cpuset:/job\n0::/user.slice/x\n"
    assert cpus.parse_proc_cgroup(text) == {"cpu": "/job/1", "cpuacct": "/job/1",
                                            "cpuset": "/job", "": "/user.slice/x"}


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_probe_reads_a_cgroup_v2_tree(tmp_path: Path) -> None:
    root, proc = tmp_path / "cg", tmp_path / "proc_cgroup"
    _write(root / "cgroup.controllers", "cpuset cpu\n")
    _write(root / "cpu.max", "800000 100000\n")
    _write(root / "job" / "cpu.max", "300000 100000\n")  # the tightest ancestor wins
    _write(root / "job" / "step" / "cpu.max", "max 100000\n")
    _write(root / "job" / "step" / "cpuset.cpus.effective", "0-1\n")
    _write(proc, "0::/job/step\n")
    found = cpus.probe(root, proc, tmp_path / "sys")
    assert found.quota == 3.0
    assert found.pool >= found.affinity
    assert cpus.read_cpuset(root, {"": "/job/step"}) == frozenset({0, 1})


def test_probe_reads_a_cgroup_v1_tree(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    _write(root / "cpu,cpuacct" / "cpu.cfs_quota_us", "-1\n")
    _write(root / "cpu,cpuacct" / "cpu.cfs_period_us", "100000\n")
    _write(root / "cpu,cpuacct" / "docker" / "c1" / "cpu.cfs_quota_us", "150000\n")
    _write(root / "cpu,cpuacct" / "docker" / "c1" / "cpu.cfs_period_us", "100000\n")
    _write(root / "cpuset" / "docker" / "c1" / "cpuset.effective_cpus", "2-5\n")
    paths = {"cpu": "/docker/c1", "cpuacct": "/docker/c1", "cpuset": "/docker/c1"}
    assert cpus.read_quota(root, paths) == 1.5
    assert cpus.read_cpuset(root, paths) == frozenset({2, 3, 4, 5})
    # Inside the container's namespace the path is not there: the mount itself is read.
    assert cpus.read_quota(root, {"cpu": "/elsewhere"}) is None


def test_probe_of_this_process() -> None:
    found = cpus.probe()
    assert found.affinity and found.affinity <= found.pool
    assert found.quota is None or found.quota > 0


# --------------------------------------------------------------------------- pinning


@pytest.mark.parametrize(("mask", "ranks", "rank", "environ", "share"), [
    (range(2), 2, 0, {}, {0}),                 # horovodrun -np 2 on 2 cores: a core each
    (range(2), 2, 1, {}, {1}),
    (range(7), 2, 1, {}, {3, 4, 5}),           # shares of equal size; CPU 6 left over
    ({0, 2, 4, 6}, 2, 1, {}, {4, 6}),          # the mask's own CPUs, in order
    (range(64), 8, 7, {}, set(range(56, 64))),
    (range(2), 1, 0, {}, None),                # one rank: nothing to share
    (range(2), 2, None, {}, None),             # the launcher did not say which rank
    (range(2), 3, 2, {}, None),                # fewer CPUs than ranks
    (range(4), 2, 0, {"SLURM_CPU_BIND_TYPE": "none"}, None),  # srun --cpu-bind=none
])
def test_cpu_share(mask, ranks: int, rank: int | None, environ: dict[str, str],
                   share: set[int] | None) -> None:
    got = thread_plan.cpu_share(view(mask), ranks, rank, environ)
    assert got == (frozenset(share) if share is not None else None)


def test_a_share_smaller_than_the_exported_threads_is_not_pinned() -> None:
    """OMP_NUM_THREADS=2 exported for 2 ranks on 2 cores: pinning each rank to its one
    core would stack its 2 compute threads there (a step took 100x longer)."""
    assert thread_plan.cpu_share(view(range(2)), 2, 0, {}, threads=2) is None
    assert thread_plan.cpu_share(view(range(4)), 2, 1, {}, threads=2) == frozenset({2, 3})
    env = {"OMP_NUM_THREADS": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
    plan = thread_plan.plan_runtime(view(range(2)), 2, env)
    assert plan.threads == 2  # exported: it wins, so the share must fit it
    assert thread_plan.cpu_share(view(range(2)), 2, 1, env, plan.threads) is None


def test_a_rank_the_launcher_bound_is_not_pinned_again() -> None:
    bound = view({1}, pool=range(2))
    assert thread_plan.cpu_share(bound, 2, 1, {"OMPI_MCA_orte_bound_at_launch": "1"}) is None


def test_local_rank_and_the_cpu_list_format() -> None:
    assert thread_plan.local_rank({"OMPI_COMM_WORLD_LOCAL_RANK": "1"}) == 1
    assert thread_plan.local_rank({"HOROVOD_LOCAL_RANK": "3"}) == 3
    assert thread_plan.local_rank({"SLURM_LOCALID": "0"}) == 0
    assert thread_plan.local_rank({"SLURM_LOCALID": "x"}) is None
    assert thread_plan.local_rank({}) is None
    assert cpus.format_cpu_list(frozenset({0, 1, 2, 5, 7, 8})) == "0-2,5,7-8"
    assert cpus.parse_cpu_list(cpus.format_cpu_list({3, 0, 1})) == {0, 1, 3}
    plan = thread_plan.plan_runtime(view(range(2)), 2, {})
    import dataclasses

    pinned = dataclasses.replace(plan, pinned=frozenset({1}))
    assert pinned.describe() == plan.describe() + ", pinned to CPU 1"


def test_pin_process_reaches_threads_started_before_and_after() -> None:
    import subprocess
    import sys

    code = """
import os, threading, time
from hpcdp.runtime import thread_plan
before = threading.Thread(target=time.sleep, args=(1,)); before.start()
cpu = min(os.sched_getaffinity(0))
assert thread_plan.pin_process(frozenset({cpu}))
seen = {}
after = threading.Thread(target=lambda: seen.update(after=os.sched_getaffinity(0))); after.start()
after.join()
print(sorted(os.sched_getaffinity(before.native_id)), sorted(seen['after']), cpu)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout.split("\n")[0]
    cpu = out.split()[-1]
    assert out == f"[{cpu}] [{cpu}] {cpu}"
