"""Rank-placement rules, checked without a launcher."""

from __future__ import annotations

import pytest

from hpcdp.doctor import launcher_rank, launcher_world_size
from hpcdp.runtime.placement import (
    RankPlacement,
    check_placement,
    device_index_for_local_rank,
    node_name,
    physical_gpu,
    placement_message,
)


def place(rank, size, local_rank, local_size, host, gpu=None):
    return RankPlacement(rank, size, local_rank, local_size, host, gpu)


def test_two_nodes_one_gpu_each_is_consistent():
    ranks = [place(0, 2, 0, 1, "n1", "0"), place(1, 2, 0, 1, "n2", "0")]
    assert check_placement(ranks) == []


def test_two_ranks_on_one_gpu_is_reported():
    ranks = [place(0, 2, 0, 2, "n1", "0"), place(1, 2, 1, 2, "n1", "0")]
    problems = check_placement(ranks)
    assert problems == ["n1: ranks [0, 1] are all bound to GPU 0"]


def test_duplicate_local_rank_and_size_mismatch_are_reported():
    ranks = [place(0, 2, 0, 2, "n1"), place(1, 3, 0, 2, "n1")]
    problems = " | ".join(check_placement(ranks))
    assert "disagree on the world size" in problems
    assert "local ranks [0, 0]" in problems


def test_missing_rank_is_reported():
    problems = check_placement([place(0, 2, 0, 2, "n1"), place(2, 2, 1, 2, "n1")])
    assert any("not 0..1" in p for p in problems)


def test_local_size_must_match_ranks_on_host():
    problems = check_placement([place(0, 1, 0, 2, "n1")])
    assert problems == ["n1: local size reported as [2] but 1 ranks run there"]


@pytest.mark.parametrize(
    ("local_rank", "visible", "want"),
    [
        (0, "0", "0"),
        (1, "3", "3"),
        (1, "0,1", "1"),
        (0, "2,3", "2"),
        (0, None, None),
        (0, "", None),
    ],
)
def test_physical_gpu(local_rank, visible, want):
    assert physical_gpu(local_rank, visible) == want


def test_more_ranks_than_gpus_is_an_error():
    with pytest.raises(ValueError, match="more ranks per node than GPUs"):
        device_index_for_local_rank(2, 2)


def test_launcher_variables():
    assert launcher_world_size({}) == 1
    assert launcher_world_size({"OMPI_COMM_WORLD_SIZE": "4"}) == 4
    assert launcher_world_size({"HOROVOD_SIZE": "2", "SLURM_STEP_NUM_TASKS": "8"}) == 2
    assert launcher_rank({"SLURM_PROCID": "3"}) == 3
    assert launcher_rank({}) is None


def test_node_name_prefers_slurm_node_name() -> None:
    assert node_name({"SLURMD_NODENAME": "node2"}, "vm") == "node2"
    assert node_name({}, "vm") == "vm"
    assert node_name({"SLURMD_NODENAME": ""}, "vm") == "vm"


def test_placement_message_names_the_shared_gpu_and_what_to_do() -> None:
    assert placement_message([]) is None
    shared = placement_message(check_placement([place(0, 2, 0, 2, "n1", "GPU-a"),
                                                place(1, 2, 1, 2, "n1", "GPU-a")]))
    assert shared is not None
    assert "n1: ranks [0, 1] are all bound to GPU GPU-a" in shared
    assert "start at most one rank per GPU" in shared
    sizes = placement_message(check_placement([place(0, 2, 0, 1, "n1"), place(1, 3, 0, 1, "n2")]))
    assert sizes is not None and "world size" in sizes and "one rank per GPU" not in sizes
