"""hpcdp.cluster.layout: the training job's task layout from Slurm's variables, as the
batch script reads it (the script itself, with stand-ins for srun: test_sbatch_launch)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_sbatch_launch import run_script

from hpcdp.cluster import layout
from hpcdp.cluster.layout import Layout, LayoutError, plan

# (Slurm's variables, ranks, nodes, GPUs per node, srun's layout options, warned)
CASES = [
    # Nothing set: one rank, one CPU (a batch shell outside a job says the same).
    ({}, 1, 1, 0, ["--ntasks=1", "--cpus-per-task=1"], False),
    # CPU-only, --ntasks-per-node=4 on 2 nodes of 16 CPUs: 4 CPUs each.
    ({"SLURM_JOB_NUM_NODES": "2", "SLURM_NTASKS_PER_NODE": "4", "SLURM_TASKS_PER_NODE": "4(x2)",
      "SLURM_JOB_CPUS_PER_NODE": "16(x2)"}, 8, 2, 0, ["--ntasks=8", "--cpus-per-task=4"], False),
    # No per-node list (Slurm always gives one in a job): all the ranks count on one node.
    ({"SLURM_JOB_NUM_NODES": "2", "SLURM_NTASKS_PER_NODE": "4",
      "SLURM_JOB_CPUS_PER_NODE": "16(x2)"}, 8, 2, 0, ["--ntasks=8", "--cpus-per-task=2"], False),
    # Nodes of different sizes: the smaller decides.
    ({"SLURM_JOB_NUM_NODES": "2", "SLURM_NTASKS": "4", "SLURM_TASKS_PER_NODE": "2(x2)",
      "SLURM_JOB_CPUS_PER_NODE": "8,4"}, 4, 2, 0, ["--ntasks=4", "--cpus-per-task=2"], False),
    # Uneven tasks: 3 and 1 on 6-CPU nodes -> 2 each.
    ({"SLURM_JOB_NUM_NODES": "2", "SLURM_NTASKS": "4", "SLURM_TASKS_PER_NODE": "3,1",
      "SLURM_JOB_CPUS_PER_NODE": "6(x2)"}, 4, 2, 0, ["--ntasks=4", "--cpus-per-task=2"], False),
    # Three nodes in Slurm's compressed form; the batch node's count when no list is given.
    ({"SLURM_JOB_NUM_NODES": "3", "SLURM_NTASKS": "5", "SLURM_TASKS_PER_NODE": "2(x2),1",
      "SLURM_CPUS_ON_NODE": "8"}, 5, 3, 0, ["--ntasks=5", "--cpus-per-task=4"], False),
    # --cpus-per-task given: taken as it is.
    ({"SLURM_NTASKS": "2", "SLURM_CPUS_PER_TASK": "3", "SLURM_JOB_CPUS_PER_NODE": "8"},
     2, 1, 0, ["--ntasks=2", "--cpus-per-task=3"], False),
    # One rank per GPU: --gpus-per-node=4 on 8 nodes, the count alone or with its type.
    ({"SLURM_JOB_NUM_NODES": "8", "SLURM_GPUS_ON_NODE": "4", "SLURM_GPUS_PER_NODE": "4",
      "SLURM_JOB_CPUS_PER_NODE": "32(x8)"},
     32, 8, 4, ["--ntasks=32", "--ntasks-per-node=4", "--cpus-per-task=8"], False),
    ({"SLURM_JOB_NUM_NODES": "2", "SLURM_GPUS_PER_NODE": "a100:2",
      "SLURM_JOB_CPUS_PER_NODE": "8(x2)"},
     4, 2, 2, ["--ntasks=4", "--ntasks-per-node=2", "--cpus-per-task=4"], False),
    # --ntasks-per-node equal to the GPUs is fine; --gpus on one node too.
    ({"SLURM_GPUS_ON_NODE": "2", "SLURM_NTASKS_PER_NODE": "2", "SLURM_GPUS": "2",
      "SLURM_JOB_CPUS_PER_NODE": "4"},
     2, 1, 2, ["--ntasks=2", "--ntasks-per-node=2", "--cpus-per-task=2"], False),
    # GPUs per task: the job's tasks, not one per GPU of the batch node.
    ({"SLURM_JOB_NUM_NODES": "2", "SLURM_NTASKS": "3", "SLURM_TASKS_PER_NODE": "2,1",
      "SLURM_GPUS_PER_TASK": "1", "SLURM_GPUS_ON_NODE": "2", "SLURM_JOB_CPUS_PER_NODE": "4,2"},
     3, 2, 2, ["--ntasks=3", "--cpus-per-task=2"], False),
    ({"SLURM_JOB_NUM_NODES": "2", "SLURM_NTASKS_PER_GPU": "2", "SLURM_GPUS_ON_NODE": "1",
      "SLURM_TASKS_PER_NODE": "1(x2)", "SLURM_JOB_CPUS_PER_NODE": "4(x2)"},
     2, 2, 1, ["--ntasks=2", "--cpus-per-task=4"], False),
    # Fewer CPUs than ranks: they share, srun is told so.
    ({"SLURM_NTASKS": "4", "SLURM_JOB_CPUS_PER_NODE": "2"},
     4, 1, 0, ["--ntasks=4", "--cpus-per-task=1", "--overcommit"], True),
    ({"SLURM_NTASKS": "2", "SLURM_CPUS_PER_TASK": "4", "SLURM_JOB_CPUS_PER_NODE": "4"},
     2, 1, 0, ["--ntasks=2", "--cpus-per-task=4", "--overcommit"], True),
]


@pytest.mark.parametrize(("environ", "ntasks", "nodes", "gpus", "srun", "warned"), CASES)
def test_layout_from_slurms_variables(environ: dict[str, str], ntasks: int, nodes: int,
                                      gpus: int, srun: list[str], warned: bool) -> None:
    got = plan(environ)
    assert (got.ntasks, got.nodes, got.gpus) == (ntasks, nodes, gpus)
    assert got.srun_options() == srun
    assert got.overcommit is warned and (got.warning is not None) is warned


def test_the_warning_names_the_first_crowded_node() -> None:
    got = plan({"SLURM_JOB_NUM_NODES": "3", "SLURM_NTASKS": "6", "SLURM_TASKS_PER_NODE": "2(x3)",
                "SLURM_JOB_CPUS_PER_NODE": "8,2,1", "SLURM_CPUS_PER_TASK": "2"})
    assert got.warning == ("2 CPUs on node 1 for 2 ranks, so ranks share CPUs; ask for "
                           "--cpus-per-gpu, --cpus-per-task or --exclusive")


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"SLURM_GPUS_ON_NODE": "4", "SLURM_NTASKS_PER_NODE": "2"},
         "one rank per GPU, but --ntasks-per-node=2 differs from the 4 GPUs per node"),
        ({"SLURM_JOB_NUM_NODES": "2", "SLURM_GPUS": "3", "SLURM_GPUS_ON_NODE": "2"},
         "--gpus=3 over 2 nodes may give the nodes different GPU counts, and one rank per "
         "GPU needs the same count on each: ask for --gpus-per-node, or --gpus-per-task "
         "with --ntasks"),
        ({"SLURM_JOB_NUM_NODES": "two"}, "SLURM_JOB_NUM_NODES='two' is not a whole number"),
        ({"SLURM_GPUS_PER_NODE": "a100:x"}, "SLURM_GPUS_PER_NODE='a100:x' is not a GPU count"),
        ({"SLURM_NTASKS": "4", "SLURM_TASKS_PER_NODE": "2(x0)"},
         "SLURM_TASKS_PER_NODE='2(x0)' is not one of Slurm's per-node lists"),
        ({"SLURM_JOB_CPUS_PER_NODE": "8,x"}, "SLURM_JOB_CPUS_PER_NODE='8,x'"),
        ({"SLURM_CPUS_PER_TASK": "-1"}, "SLURM_CPUS_PER_TASK='-1' is not a whole number"),
    ],
)
def test_what_cannot_be_laid_out_is_named(environ: dict[str, str], message: str) -> None:
    with pytest.raises(LayoutError) as err:
        plan(environ)
    assert message in str(err.value)


def test_a_typed_count_with_gpus_per_node_set_is_one_rank_per_gpu() -> None:
    """--gpus=N over several nodes is refused only where --gpus-per-node does not fix it."""
    environ = {"SLURM_JOB_NUM_NODES": "2", "SLURM_GPUS": "8", "SLURM_GPUS_PER_NODE": "4"}
    assert plan(environ).ntasks == 8


def test_main_prints_what_the_script_reads(capsys: pytest.CaptureFixture[str]) -> None:
    environ = {"SLURM_NTASKS": "4", "SLURM_JOB_CPUS_PER_NODE": "2"}
    assert layout.main([], environ) == 0
    out, err = capsys.readouterr()
    assert out == "4 1 0 1 1\n--ntasks=4 --cpus-per-task=1 --overcommit\n"
    assert re.fullmatch(r"\[hpcdp\.sbatch \d\d:\d\d:\d\d\] warning: 2 CPUs on node 0 for 4 "
                        r"ranks, so ranks share CPUs; .*\n", err), err
    assert layout.main([], {"SLURM_GPUS_ON_NODE": "4", "SLURM_NTASKS_PER_NODE": "3"}) == 2
    out, err = capsys.readouterr()
    assert out == "" and "] error: one rank per GPU, but --ntasks-per-node=3" in err


def test_shell_lines_hold_no_spaces_in_a_word() -> None:
    text = layout.shell_lines(Layout(2, 4, 8, 4, 6))
    assert text == "8 2 4 6 0\n--ntasks=8 --ntasks-per-node=4 --cpus-per-task=6\n"


def test_run_as_a_module_in_a_fresh_interpreter() -> None:
    """As the batch script runs it: `python -m hpcdp.cluster.layout` with the job's variables."""
    done = subprocess.run([sys.executable, "-m", "hpcdp.cluster.layout"],
                          env={"SLURM_JOB_NUM_NODES": "2", "SLURM_GPUS_ON_NODE": "2",
                               "SLURM_JOB_CPUS_PER_NODE": "8(x2)",
                               **{k: v for k, v in os.environ.items()
                                  if k in ("PATH", "PYTHONPATH")}},
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "4 2 2 4 0\n--ntasks=4 --ntasks-per-node=2 --cpus-per-task=4\n"


def test_the_batch_script_names_a_python_that_cannot_work_out_the_layout(
        tmp_path: Path) -> None:
    status, out, standin = run_script(tmp_path, {"HPCDP_BATCH_PYTHON": "no-such-python"})
    assert status == 127, out
    assert "error: no-such-python -m hpcdp.cluster.layout failed (exit status 127)" in out
    assert not (standin / "srun.args").exists()
    # HPCDP_BATCH_PYTHON works out the layout; the ranks still run HPCDP_PYTHON's.
    env = {"HPCDP_BATCH_PYTHON": sys.executable, "HPCDP_PYTHON": "rank-python",
           "SLURM_NTASKS": "2", "SLURM_JOB_CPUS_PER_NODE": "4"}
    status, out, standin = run_script(tmp_path, env)
    assert status == 0, out
    args = (standin / "srun.args").read_text().splitlines()
    assert args[:2] == ["--ntasks=2", "--cpus-per-task=2"] and "rank-python" in args, args
