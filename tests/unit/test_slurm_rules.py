"""The Python side of running under Slurm, without Slurm: requeue target and outcome
(array tasks, truthful exit statuses, the requeue cap), `${VAR}` in config paths, the
GPU rule over environment matrices and a fake sysfs tree, and the PMI mismatch check.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcdp import config as c
from hpcdp.config import ConfigError
from hpcdp.runtime.placement import (
    PlacementError,
    choose_gpu,
    gpu_cpus,
    launch_mismatch,
    nearest_gpu,
    node_gpu_count,
)
from hpcdp.runtime.preempt import (
    EXIT_REQUEUE,
    EXIT_STOPPED,
    after_stop,
    requeue_target,
    stop_outcome,
)

ARRAY = {"SLURM_JOB_ID": "41", "SLURM_ARRAY_JOB_ID": "40", "SLURM_ARRAY_TASK_ID": "1"}


# ---- requeue ------------------------------------------------------------------------


def test_requeue_target_is_the_array_task_never_the_array() -> None:
    assert requeue_target(ARRAY) == "40_1"
    # Task 0 of an array: its JobId IS the array's id, which would requeue every task.
    assert requeue_target({"SLURM_JOB_ID": "40", "SLURM_ARRAY_JOB_ID": "40",
                           "SLURM_ARRAY_TASK_ID": "0"}) == "40_0"
    assert requeue_target({"SLURM_JOB_ID": "9"}) == "9"
    assert requeue_target({}) is None


def attempts(outcome: str, why: str = "why") -> tuple[list[str], object]:
    calls: list[str] = []

    def attempt(job: str) -> tuple[str, str]:
        calls.append(job)
        return outcome, why

    return calls, attempt


def test_requeued_run_exits_zero_and_names_the_task() -> None:
    calls, attempt = attempts("requeued")
    assert stop_outcome("preempted", True, 20, ARRAY, attempt) == (", requeued job 40_1", 0)
    assert calls == ["40_1"]


def test_a_requeue_the_ranks_cannot_make_is_left_to_the_batch_shell() -> None:
    _, attempt = attempts("failed", "scontrol not found")
    note, code = stop_outcome("preempted", True, 20, {"SLURM_JOB_ID": "5"}, attempt)
    assert code == EXIT_REQUEUE and "scontrol not found" in note and "batch script" in note


@pytest.mark.parametrize(
    ("requeue", "cap", "environ", "outcome", "needle"),
    [
        (False, 20, {"SLURM_JOB_ID": "5"}, "requeued", "preempt.requeue=false"),
        (True, 2, {"SLURM_JOB_ID": "5", "SLURM_RESTART_COUNT": "2"}, "requeued",
         "requeued 2 time(s) already, preempt.max_requeues=2"),
        (True, 0, {"SLURM_JOB_ID": "5"}, "requeued", "preempt.max_requeues=0"),
        (True, 20, {"SLURM_JOB_ID": "5"}, "refused", "not requeued: why"),
    ],
)
def test_unfinished_and_not_requeued_exits_nonzero(requeue: bool, cap: int,
                                                    environ: dict[str, str], outcome: str,
                                                    needle: str) -> None:
    calls, attempt = attempts(outcome)
    note, code = stop_outcome("preempted", requeue, cap, environ, attempt)
    assert code == EXIT_STOPPED and needle in note, note
    assert calls == ([] if outcome == "requeued" else ["5"])  # capped: not even tried


def test_finished_stop_hook_and_no_scheduler_exit_zero() -> None:
    calls, attempt = attempts("failed")
    assert stop_outcome("stopped", True, 20, ARRAY, attempt) == ("", 0)
    assert stop_outcome("preempted", True, 20, {}, attempt) == ("", 0)  # run again to resume
    assert calls == []


def test_after_stop_shares_rank_zeros_outcome() -> None:
    shared: list[object] = []

    def share(value: object) -> tuple[str, int]:
        shared.append(value)
        return ", from rank 0", EXIT_STOPPED

    env = {"SLURM_JOB_ID": "5"}
    assert after_stop("preempted", False, False, 20, env, share) == (", from rank 0", 76)
    assert shared == [None]  # a non-root rank decides nothing itself
    after_stop("preempted", True, False, 20, env, share)
    assert shared[1] == (", job 5 not requeued (preempt.requeue=false)", EXIT_STOPPED)


def test_max_requeues_is_a_checked_config_key() -> None:
    assert c.build(None, ["data.path=d"]).preempt.max_requeues == 20
    with pytest.raises(ConfigError, match="preempt.max_requeues=-1: must not be negative"):
        c.build(None, ["data.path=d", "preempt.max_requeues=-1"])


# ---- ${VAR} in config paths -----------------------------------------------------------


def test_paths_expand_environment_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "3")
    monkeypatch.setenv("SCRATCH", "/scratch/me")
    cfg = c.build(None, ["run.dir=runs/r_${SLURM_ARRAY_TASK_ID}",
                         "data.path=${SCRATCH}/digits", "checkpoint.dir=${SCRATCH}/ck"])
    assert cfg.run.dir == "runs/r_3" and cfg.run_dir == Path("runs/r_3")
    assert cfg.data.path == "/scratch/me/digits" and cfg.checkpoint.dir == "/scratch/me/ck"
    assert cfg.run.name == "default"  # other strings are left alone


def test_unset_or_malformed_variables_name_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HPCDP_NO_SUCH_VAR", raising=False)
    with pytest.raises(ConfigError, match="run.dir=.*HPCDP_NO_SUCH_VAR is not set"):
        c.build(None, ["data.path=d", "run.dir=runs/${HPCDP_NO_SUCH_VAR}"])
    with pytest.raises(ConfigError, match=r"data.path=.*\$\{1x\} is not a variable name"):
        c.build(None, ["data.path=${1x}"])


# ---- which GPU a rank uses ------------------------------------------------------------


@pytest.mark.parametrize(
    ("visible", "local_rank", "node_gpus", "want"),
    [
        (["1"], 1, 2, 0),  # --gpus-per-task=1: the one GPU it sees, whatever its local rank
        (["1"], 0, 2, 0),  # --gpu-bind=map_gpu:1,0: task 0 sees GPU 1
        (["0", "1", "2", "3"], 2, 4, 2),  # sees the node's GPUs: its local rank's
        (["0", "1"], 1, None, 1),  # no Slurm: what it sees is the node's
    ],
)
def test_gpu_rule_over_environments(visible: list[str], local_rank: int,
                                    node_gpus: int | None, want: int) -> None:
    assert choose_gpu(visible, local_rank, node_gpus) == want


@pytest.mark.parametrize(
    ("visible", "local_rank", "node_gpus", "needle"),
    [
        (["0", "1"], 0, 4, "sees 2 of the node's 4 GPUs (CUDA_VISIBLE_DEVICES=0,1)"),
        (["0", "1"], 2, 2, "local rank 2 has no GPU of its own"),
        ([], 0, 2, "sees no GPU"),
    ],
)
def test_gpu_rule_errors_name_node_rank_and_view(visible: list[str], local_rank: int,
                                                 node_gpus: int | None, needle: str) -> None:
    with pytest.raises(PlacementError) as err:
        choose_gpu(visible, local_rank, node_gpus, where="rank 5 on node7")
    assert "rank 5 on node7" in str(err.value) and needle in str(err.value)


def fake_sysfs(root: Path, cpulists: dict[str, str]) -> Path:
    for address, cpus in cpulists.items():
        device = root / "bus" / "pci" / "devices" / address
        device.mkdir(parents=True)
        (device / "local_cpulist").write_text(cpus + "\n")
    return root


def test_nearest_gpu_from_a_fake_sysfs_tree(tmp_path: Path) -> None:
    # Two sockets of 8 cores (and their hyperthreads), one GPU on each.
    sysfs = fake_sysfs(tmp_path, {"0000:3b:00.0": "0-7,16-23", "0000:af:00.0": "8-15,24-31"})
    near = gpu_cpus(["0000:3B:00.0", "0000:af:00.0", "0000:00:00.0", None], sysfs)
    socket0, socket1 = {*range(0, 8), *range(16, 24)}, {*range(8, 16), *range(24, 32)}
    assert near[:2] == [socket0, socket1]
    assert near[2:] == [None, None]  # no such device; address unknown
    near = near[:2]
    # Local rank 0 bound to the second socket (a cyclic distribution): its near GPU, 1.
    assert choose_gpu(["0", "1"], 0, 2, {9, 10}, near) == 1
    assert choose_gpu(["0", "1"], 1, 2, {0, 16}, near) == 0
    # Unbound (all CPUs) or straddling evenly: no GPU is nearer, so the local rank's.
    assert choose_gpu(["0", "1"], 1, 2, set(range(32)), near) == 1
    assert choose_gpu(["0", "1"], 0, 2, {7, 8}, near) == 0
    # Unknown topology: the local rank's.
    assert choose_gpu(["0", "1"], 1, 2, {0}, [None, None]) == 1
    assert nearest_gpu({1}, []) is None


def test_node_gpu_count() -> None:
    assert node_gpu_count({"SLURM_GPUS_ON_NODE": "4"}) == 4
    assert node_gpu_count({}) is None


# ---- PMI mismatch ---------------------------------------------------------------------


def test_a_world_of_one_under_several_tasks_names_the_mpi_plugin() -> None:
    message = launch_mismatch(1, {"SLURM_STEP_NUM_TASKS": "2", "SLURM_MPI_TYPE": "none"})
    assert message and "srun started 2 tasks" in message and "--mpi=none" in message
    assert "HPCDP_SRUN_MPI" in message
    assert "MpiDefault" in (launch_mismatch(1, {"SLURM_STEP_NUM_TASKS": "4"}) or "")
    assert launch_mismatch(2, {"SLURM_STEP_NUM_TASKS": "2"}) is None
    assert launch_mismatch(1, {"SLURM_STEP_NUM_TASKS": "1"}) is None
    assert launch_mismatch(1, {}) is None  # not under srun
    assert launch_mismatch(4, {"SLURM_STEP_NUM_TASKS": "1"}) is None  # mpirun inside a step
