"""The npz recipe (hpcdp.data.prep.npz) on two ranks: the file of one rank, and after a kill
mid-way (SIGKILL to the launcher and its ranks) and --resume."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from test_prep_recipes import _parts, kill_when, same_files

from hpcdp.data.prep import cli as prep

pytestmark = pytest.mark.parallel

PREP = [sys.executable, "-m", "hpcdp.data.prep.cli"]


def shards(d: Path) -> list[str]:
    """Three shards, one of each kind: a plain .npz, a compressed one, a folder of .npy."""
    rng = np.random.default_rng(3)
    x = rng.integers(0, 256, (3000, 3, 8, 8), dtype=np.uint8)
    y = rng.integers(0, 10, 3000)
    np.savez(d / "part-0.npz", x=x[:1100], y=y[:1100], notes=np.zeros(2))
    np.savez_compressed(d / "part-1.npz", x=x[1100:2300], y=y[1100:2300])
    (d / "part-2").mkdir()
    np.save(d / "part-2" / "x.npy", x[2300:])
    np.save(d / "part-2" / "y.npy", y[2300:])
    return ["npz", "--files", str(d / "part-*"), "--block-mib", "0.005", "--chunk-mib", "0.002"]


def test_two_ranks_write_what_one_writes_and_resume_after_a_kill(ranks, tmp_path: Path,
                                                                 capsys) -> None:
    (tmp_path / "in").mkdir()
    args = shards(tmp_path / "in")
    assert prep.main([*args, "--out", str(tmp_path / "one")]) == 0
    with np.load(tmp_path / "in" / "part-1.npz") as got:  # the rows, in the shards' order
        middle = got["x"]
    import h5py

    with h5py.File(tmp_path / "one" / "train.h5") as f:
        np.testing.assert_array_equal(f["x"][1100:2300], middle)
    ranks(PREP, *args, "--out", str(tmp_path / "two"), np=2, timeout=120)
    same_files(tmp_path / "one", tmp_path / "two")

    out = tmp_path / "killed"
    kill_when([*PREP, *args, "--out", str(out)], lambda: _parts(out) >= 1)
    killed_parts = _parts(out)
    assert (out / ".hpcdp-prep").is_dir() and not (out / "train.h5").exists()
    resumed = ranks(PREP, *args, "--out", str(out), "--resume", np=2, timeout=120)
    assert f"train: resuming: {killed_parts} of " in resumed.output, resumed.describe()
    same_files(tmp_path / "one", out)
