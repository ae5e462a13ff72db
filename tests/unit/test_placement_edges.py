"""Placement at its edges: the exact messages a user reads when ranks are placed badly.

Each test pins down a behaviour that mutation testing (`make mutate`) found unguarded.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcdp.runtime.placement import (
    RankPlacement,
    check_placement,
    device_index_for_local_rank,
    gpu_cpus,
    placement_message,
)


@pytest.mark.parametrize("local_rank", [0, 1])
def test_no_visible_gpu_is_named_as_such(local_rank: int) -> None:
    with pytest.raises(ValueError) as err:
        device_index_for_local_rank(local_rank, 0)
    assert str(err.value) == "no visible GPU to bind to"


def test_more_ranks_than_gpus_message() -> None:
    with pytest.raises(ValueError) as err:
        device_index_for_local_rank(2, 2)
    assert str(err.value) == ("local rank 2 has no GPU of its own: only 2 visible "
                              "(more ranks per node than GPUs)")


def test_local_ranks_problem_names_the_expected_range() -> None:
    ranks = [RankPlacement(0, 3, 0, 3, "a", None), RankPlacement(1, 3, 2, 3, "a", None),
             RankPlacement(2, 3, 5, 3, "a", None)]
    assert check_placement(ranks) == ["a: local ranks [0, 2, 5] are not 0..2"]


def test_placement_message_in_full() -> None:
    assert placement_message([]) is None
    assert placement_message(["x", "y"]) == "x; y"
    shared = ["a: ranks [0, 1] are all bound to GPU 0", "b: local ranks [1] are not 0..0"]
    assert placement_message(shared) == (
        "a: ranks [0, 1] are all bound to GPU 0; b: local ranks [1] are not 0..0: start at most "
        "one rank per GPU (fewer ranks per node, or give each rank its own GPU, e.g. Slurm's "
        "--gpus-per-task=1 or CUDA_VISIBLE_DEVICES)")


def test_cpulists_skip_empty_parts() -> None:
    from hpcdp.runtime.cpus import parse_cpu_list

    assert parse_cpu_list("0-1,,4\n") == {0, 1, 4}
    assert parse_cpu_list("") == set()


def test_a_malformed_local_cpulist_leaves_that_gpu_unknown(tmp_path: Path) -> None:
    device = tmp_path / "bus" / "pci" / "devices" / "0000:3b:00.0"
    device.mkdir(parents=True)
    (device / "local_cpulist").write_text("7-3\n")  # backwards: not a list the kernel writes
    assert gpu_cpus(["0000:3b:00.0"], tmp_path) == [None]


def test_the_nearest_gpu_may_hold_a_single_cpu_and_unknown_ones_hold_none() -> None:
    from hpcdp.runtime.placement import nearest_gpu

    assert nearest_gpu({0}, [{0}, {5}]) == 0  # one CPU of the affinity is enough
    assert nearest_gpu({0}, [None, {9}]) is None  # neither GPU's CPUs hold CPU 0
    assert nearest_gpu({0}, [set(), {0, 1}]) == 1
