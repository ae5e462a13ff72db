"""`hpcdp slurm render/submit --nodes MIN-MAX`: the range rendered, the global batch required."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcdp.cluster import cli, node_range
from hpcdp.cluster.render import RenderError, render


def test_range_is_rendered_and_a_count_unchanged() -> None:
    assert "#SBATCH --nodes=1-4\n" in render(nodes="1-4")
    assert render(nodes="3-3") == render(nodes=3)  # a one-count range is that count
    assert "#SBATCH --nodes=2\n" in render(nodes=2)


def test_one_rank_per_node_is_left_to_slurm_on_a_range() -> None:
    # With --ntasks-per-node=1, Slurm takes MIN tasks and never grants more than MIN nodes.
    assert "#SBATCH --ntasks-per-node" not in render(nodes="1-2", ntasks_per_node=1)
    assert "#SBATCH --ntasks-per-node" not in render(nodes="1-2", gpus_per_node=1)
    assert "#SBATCH --ntasks-per-node=2\n" in render(nodes="1-2", gpus_per_node=2)
    assert "#SBATCH --ntasks-per-node=1\n" in render(nodes=2, ntasks_per_node=1)


@pytest.mark.parametrize("nodes, match", [
    ("4-2", "1 <= MIN <= MAX"), ("0-2", "1 <= MIN <= MAX"), ("1-", "a range MIN-MAX"),
    ("1 -2", "a range MIN-MAX"), ("2", "nodes must be an integer"),
])
def test_bad_ranges(nodes: str, match: str) -> None:
    with pytest.raises(RenderError, match=match):
        render(nodes=nodes)


def test_batch_error() -> None:
    assert node_range.batch_error(1, 4, 1, 0) is not None  # per-rank batch: refused
    assert node_range.batch_error(1, 4, 2, 48) is None  # 2, 4, 6, 8 ranks all divide 48
    why = node_range.batch_error(1, 3, 2, 64)
    assert why is not None and "3 node(s) = 6 ranks" in why and "1 node" not in why


def test_global_batch_from_config_and_overrides(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text("[data]\nglobal_batch_size = 32\nbatch_size = 8\n")
    assert node_range.configured_global_batch(str(cfg), []) == 32
    assert node_range.configured_global_batch(str(cfg), ["data.global_batch_size=64"]) == 64
    assert node_range.configured_global_batch(None, ["data.batch_size=8"]) == 0
    with pytest.raises(RenderError, match="does not exist"):
        node_range.configured_global_batch(str(tmp_path / "none.toml"), [])


def test_cli_refuses_a_range_with_a_per_rank_batch(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text("[data]\nbatch_size = 32\n")
    assert cli.main(["render", "--site", "none", "--nodes", "1-2", "--config", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "set data.global_batch_size" in err and "peak learning rate" in err
    assert cli.main(["render", "--site", "none", "--nodes", "1-2", "--ntasks-per-node", "2",
                     "--config", str(cfg), "data.global_batch_size=6"]) == 2
    assert "2 node(s) = 4 ranks" in capsys.readouterr().err
    assert cli.main(["render", "--site", "none", "--nodes", "1-2", "--config", str(cfg),
                     "data.global_batch_size=64"]) == 0
    out = capsys.readouterr().out
    assert "#SBATCH --nodes=1-2\n" in out and "data.global_batch_size=64" in out


def test_cli_fixed_count_needs_no_global_batch(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["render", "--site", "none", "--nodes", "2"]) == 0
    assert capsys.readouterr().out == render(nodes=2)
