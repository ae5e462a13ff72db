"""The Criteo recipe under mpirun: the files one rank writes; bad lines named on every rank;
nothing replaced without --overwrite."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from hpcdp.data.prep.clicks import criteo_recipe as criteo_prep

pytestmark = pytest.mark.parallel

SCRIPT = [sys.executable, str(Path(__file__).resolve().parents[2] / "datasets" / "criteo.py")]


def line(rng: np.random.Generator) -> bytes:
    counts = ["" if rng.random() < 0.1 else str(int(rng.integers(-1, 40))) for _ in range(13)]
    cats = ["" if rng.random() < 0.1 else f"{int(rng.zipf(1.5)) % 500 * 2654435761 % 2**32:08x}"
            for _ in range(26)]
    return "\t".join([str(int(rng.random() < 0.25)), *counts, *cats]).encode()


def logs(root: Path) -> list[str]:
    """Two plain training files (split between the ranks by bytes), a gzipped one, a val file."""
    import gzip

    root.mkdir()
    rng = np.random.default_rng(3)
    for name, rows in (("day_0.txt", 700), ("day_1.gz", 300), ("day_2.txt", 500),
                       ("val.txt", 400)):
        data = b"\n".join(line(rng) for _ in range(rows)) + b"\n"
        (root / name).write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    return ["--files", str(root / "day_*"), "--val-files", str(root / "val.txt")]


def digest(path: Path) -> dict[str, str]:
    with h5py.File(path) as f:
        out = {k: hashlib.sha256(f[k][...].tobytes()).hexdigest() for k in f}
        out.update({f"attr {k}": str(v) for k, v in f.attrs.items()})
        out.update({f"chunks {k}": str(f[k].chunks) for k in f})
    return out


@pytest.mark.parametrize("rule", [["--min-count", "3"], ["--buckets", "1000"]])
def test_one_and_two_ranks_write_the_same_files(ranks, tmp_path: Path, rule: list[str]) -> None:
    args = [*logs(tmp_path / "logs"), *rule]
    assert criteo_prep.main([*args, "--out", str(tmp_path / "one")]) == 0
    run = ranks(SCRIPT, *args, "--out", str(tmp_path / "two"), np=2, timeout=120)
    assert "on 2 rank(s)" in run.output
    for split in ("train.h5", "val.h5"):
        assert digest(tmp_path / "one" / split) == digest(tmp_path / "two" / split), split
    with h5py.File(tmp_path / "two" / "train.h5") as f:
        assert f.attrs["num_samples"] == 1500
        if rule[0] == "--min-count":  # a vocabulary counted over both ranks' rows
            sizes = f.attrs["table_sizes"]
            assert sizes.min() > 2 and sizes.max() < 500


def test_a_bad_line_is_named_on_every_rank_and_nothing_replaced(ranks, tmp_path: Path) -> None:
    args = [*logs(tmp_path / "logs"), "--buckets", "50"]
    out = tmp_path / "out"
    bad = tmp_path / "logs" / "day_2.txt"  # the last file: in rank 1's share of the bytes
    lines = bad.read_bytes().split(b"\n")
    lines[449] = lines[449].replace(b"\t", b" ", 1)
    bad.write_bytes(b"\n".join(lines))
    run = ranks(SCRIPT, *args, "--out", str(out), np=2, timeout=90, expect_ok=False)
    assert not run.timed_out and run.returncode != 0, run.describe()
    problem = f"{bad}: line 450: 39 tab-separated fields, expected 40"
    for rank in (0, 1):
        assert f"[rank {rank}] datasets/criteo.py: error: {problem}" in run.output, run.describe()
    assert not out.exists() or not list(out.iterdir())
    run = ranks(SCRIPT, *args, "--out", str(out), "--skip-bad", np=2, timeout=90)
    assert "1 bad lines skipped" in run.output
    before = (out / "train.h5").read_bytes()
    run = ranks(SCRIPT, *args, "--out", str(out), "--skip-bad", "--buckets", "60", np=2,
                timeout=90, expect_ok=False)
    assert run.returncode != 0 and run.output.count("exists; pass --overwrite") == 2
    assert (out / "train.h5").read_bytes() == before
